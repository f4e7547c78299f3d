// StatusReport: this agent's part of `ddprun status` (launcher/status/job_status.h, docs/observability.md). The
// agent loop tells it what the agent is doing (set_state) and hands it the running group; it publishes a JSON
// document through the rendezvous handler (RendezvousHandler::publish_status) when the state changes and
// every kStatusInterval while a round runs — one store request each, at most one per second.
//
// The document (schema version 1; every field always present, null where unknown; the agent's identity is
// its key's name):
//   {"v": 1, "host", "pid", "backend", "state", "detail", "time" (unix seconds),
//    "round", "node_rank", "nodes", "local_world_size", "base_rank", "world_size",
//    "restarts_used", "restarts_max", "restarts_caused",
//    "ranks": [{"rank", "local_rank", "pid", "state", "progress_age_s", "step", "step_time_s",
//               "before_collective_s"}]}
// state: forming (in the rendezvous), unhealthy, running, stopping, done, failed. A rank's state: running,
// succeeded, failed, stopped; its step, step time and time before its step's first collective come from its
// $DDPRUN_PROGRESS_FILE (agent/watchdog/progress_monitor.h Heartbeat; null where the file has none),
// progress_age_s is the age of that file (null without one). Bounded: at most kMaxRanks ranks, detail at most
// 200 bytes.
//
// Threads: the agent loop's. Never throws except std::bad_alloc (a store error is logged at debug level: the
// status is best effort and must not disturb the job).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "agent/agent_config.h"
#include "agent/worker_group.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

constexpr std::chrono::milliseconds kStatusInterval{2000};
constexpr size_t kMaxStatusRanks = 256;

class StatusReport {
 public:
  using Clock = std::chrono::steady_clock;

  StatusReport(const AgentConfig& config, rdzv::RendezvousHandler& rendezvous, const JobState& job)
      : config_(config), rdzv_(rendezvous), job_(job) {}

  // A new state (and why, for people): published now (at most one per second: else at the next refresh).
  void set_state(const std::string& state, const std::string& detail = "");
  // The group of the running round (nullptr: none); published with the next refresh.
  void set_group(const WorkerGroup* group) { group_ = group; }
  void count_caused_restart() { ++restarts_caused_; }
  // When the next refresh is due (nullopt: nothing to publish), and the refresh itself.
  std::optional<Clock::time_point> next() const { return due_; }
  void refresh();

  // The document as it would be published now (tests).
  std::string document() const;

 private:
  const AgentConfig& config_;
  rdzv::RendezvousHandler& rdzv_;
  const JobState& job_;
  const WorkerGroup* group_ = nullptr;
  std::string state_ = "forming", detail_;
  int restarts_caused_ = 0;
  std::optional<Clock::time_point> due_;
  std::optional<Clock::time_point> last_;
};

}  // namespace ddprun::agent
