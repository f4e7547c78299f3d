// ProgressSampler: hang detection (--hang_timeout) during one round. While the group is healthy it samples
// every running worker every progress_interval (CPU time of its process group, its log files' sizes, its
// heartbeats: agent/watchdog/progress_monitor.h) and says when no local rank made progress for hang_timeout.
//
// Threads: the loop's only. Reads /proc and the file system; never throws but std::bad_alloc. Internal to the
// agent loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "agent/watchdog/progress_monitor.h"
#include "agent/worker_group.h"

namespace ddprun::agent {

class ProgressSampler {
 public:
  using Clock = std::chrono::steady_clock;

  // Off when hang_timeout is 0; else the first sample is due at once.
  explicit ProgressSampler(std::chrono::milliseconds hang_timeout);

  // When the next sample is due; nullopt when off, or for good once the group is no longer healthy.
  std::optional<Clock::time_point> next(const WorkerGroup& group);
  // Samples every running worker (timer_requests: torch FileTimer requests so far, which count for every
  // rank) and schedules the next sample. True when the group is hung.
  bool sample(const WorkerGroup& group, uint64_t timer_requests);

 private:
  std::chrono::milliseconds hang_timeout_;
  ProgressTracker tracker_;
  std::optional<Clock::time_point> next_;
};

}  // namespace ddprun::agent
