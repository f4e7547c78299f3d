// RankSample: one tick's look at a running rank (agent/observe/observer.h): its heartbeat file
// ($DDPRUN_PROGRESS_FILE, agent/watchdog/progress_monitor.h) read once, and the file's age. The status
// document and the metrics of that tick are made from the same samples.
//
// Threads: any. Never throws but std::bad_alloc (an unreadable or missing file reads as nothing).
#pragma once

#include <optional>
#include <vector>

#include "agent/watchdog/progress_monitor.h"
#include "agent/worker_group.h"

namespace ddprun::agent {

struct RankSample {
  std::optional<Heartbeat> beat;  // nullopt: no file yet, or nothing readable in it
  std::optional<double> age_s;    // seconds since the file was last written; nullopt: no file
};

// One sample per worker of `group`, in the group's order.
std::vector<RankSample> sample_ranks(const WorkerGroup& group);

}  // namespace ddprun::agent
