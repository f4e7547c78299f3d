// StatusReport: this agent's part of `ddprun status` (launcher/status/job_status.h, docs/observability.md):
// what the agent is doing (set_state: forming, unhealthy, running, stopping, done, failed, with a detail for
// people) and the group of its running round, made into its status document (status_document.h) from one
// tick's samples of its ranks (rank_sample.h). A rank's step, step time and time before its step's first
// collective come from its heartbeat file (null where the file has none); progress_age_s is the file's age.
// With --state_memory, each rank's newest state version here and at the buddy, and the bytes held
// (agent/state/state_stats.h).
// Bounded: at most kMaxStatusRanks ranks, the detail at most 200 bytes.
//
// Pure: the Observer (observer.h) decides when a document is made and publishes it. Threads: the agent
// loop's. Never throws but std::bad_alloc.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/observe/rank_sample.h"
#include "agent/state/state_stats.h"
#include "agent/worker_group.h"

namespace ddprun::agent {

constexpr std::chrono::milliseconds kStatusInterval{2000};
constexpr size_t kMaxStatusRanks = 256;

class StatusReport {
 public:
  StatusReport(const AgentConfig& config, const JobState& job) : config_(config), job_(job) {}

  void set_state(const std::string& state, const std::string& detail = "");
  const std::string& state() const { return state_; }
  // The group of the running round (nullptr: none).
  void set_group(const WorkerGroup* group) { group_ = group; }
  const WorkerGroup* group() const { return group_; }
  void count_caused_restart() { ++restarts_caused_; }

  // The document now; `samples`: the group's ranks (one per worker, in order; empty without a group);
  // `state`: the training state's figures (nullptr without --state_memory).
  std::string document(const std::vector<RankSample>& samples, const StateStats* state = nullptr) const;

 private:
  const AgentConfig& config_;
  const JobState& job_;
  const WorkerGroup* group_ = nullptr;
  std::string state_ = "forming", detail_;
  int restarts_caused_ = 0;
};

}  // namespace ddprun::agent
