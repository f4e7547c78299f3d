// Observer: what the job shows of this agent, in one place — its status document for `ddprun status`
// (status_report.h), the job-wide straggler report when it is node rank 0 (straggler_watch.h), and the gauges
// of --metrics_port (agent_metrics.h). The agent loop tells it what the agent does (set_state, set_group,
// count_caused_restart) and calls tick() when next() is due: one tick per sample, which reads each rank's
// heartbeat file once (rank_sample.h) and hands the same samples to the document and the metrics; a state
// change is published at once (at most one document a second: else at the next tick).
//
// Store I/O happens on the StatusChannel's thread (status_channel.h) with a connection of its own, opened
// where RendezvousHandler::observer_store() says the job's store is: a stalled or lost store never holds up
// the agent loop. The straggler episodes that thread finds come back at the next tick, to the event log
// (lifecycle_log.h) and the metrics.
//
// Threads: the agent loop's (the metrics server's thread reads AgentMetrics, which locks). Never throws but
// std::bad_alloc.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "agent/agent_config.h"
#include "agent/observe/agent_metrics.h"
#include "agent/observe/lifecycle_log.h"
#include "agent/observe/status_channel.h"
#include "agent/observe/status_report.h"
#include "agent/worker_group.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

class Observer {
 public:
  using Clock = std::chrono::steady_clock;

  // The references must outlive the observer.
  Observer(const AgentConfig& config, rdzv::RendezvousHandler& rendezvous, const JobState& job,
           LifecycleLog& lifecycle);

  // --metrics_port: from now on the ticks refresh `metrics` (which must outlive the observer).
  void attach_metrics(AgentMetrics* metrics) { metrics_ = metrics; }
  // --state_memory: from now on the documents and the metrics show what `state` returns at each tick.
  void attach_state(std::function<StateStats()> state) { state_ = std::move(state); }
  // What the agent does now (and why, for people): published now (at most one document per second).
  void set_state(const std::string& state, const std::string& detail = "");
  // The group of the running round (nullptr: none); published with the next tick, the metrics refreshed now.
  void set_group(const WorkerGroup* group);
  void count_caused_restart() { report_.count_caused_restart(); }
  // When the next tick is due.
  std::optional<Clock::time_point> next() const { return due_; }
  void tick();
  // At the agent's end: waits up to `timeout` for the last document to be published.
  void flush(std::chrono::milliseconds timeout) { channel_.flush(timeout); }

  // The document as it would be published now (tests).
  std::string document() const;

 private:
  void record_stragglers();

  const AgentConfig& config_;
  rdzv::RendezvousHandler& rdzv_;
  const JobState& job_;
  LifecycleLog& lifecycle_;
  AgentMetrics* metrics_ = nullptr;
  std::function<StateStats()> state_;  // empty without --state_memory
  StatusReport report_;
  std::optional<Clock::time_point> due_;
  std::optional<Clock::time_point> last_;  // the last tick
  StatusChannel channel_;                  // last: its thread stops first
};

}  // namespace ddprun::agent
