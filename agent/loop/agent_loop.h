// AgentLoop: ElasticAgent's loop (agent/elastic_agent.h), as the steps of one round that its run() takes in
// turn:
//
//   rendezvous -> assign (the round's WorkerGroup) -> spawn -> monitor -> restart, rejoin or finish
//
// monitor() waits for events (agent/loop/event_queue.h), hands each to supervise() (agent/worker_group.h),
// which decides, and performs the actions it returns, one function per action (agent_actions.cc); their
// results go back to supervise() as events. The round ends with supervise()'s kFinish action.
//
// The loop owns, besides the rendezvous handler: the run directory (agent/loop/run_directory.h), the workers'
// processes on the io thread (agent/loop/worker_processes.h), the store watcher thread
// (agent/loop/round_watcher.h), torch's events (agent/observe/job_events.h), the event log
// (agent/observe/lifecycle_log.h) and what the job shows of it: status, stragglers, metrics
// (agent/observe/observer.h).
//
// Threads: run() on the caller's thread; the io thread and the watcher report through the EventQueue only.
// Internal to the agent.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "agent/agent_config.h"
#include "agent/health/nvml.h"
#include "agent/loop/event_queue.h"
#include "agent/loop/round_watcher.h"
#include "agent/loop/run_directory.h"
#include "agent/loop/worker_processes.h"
#include "agent/observe/agent_metrics.h"
#include "agent/observe/job_events.h"
#include "agent/observe/lifecycle_log.h"
#include "agent/observe/metrics_server.h"
#include "agent/observe/observer.h"
#include "agent/worker_group.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

class AgentLoop {
 public:
  AgentLoop(AgentConfig config, std::unique_ptr<rdzv::RendezvousHandler> rendezvous);
  // Stops the watcher, then kills and reaps every worker (WorkerProcesses' destructor).
  ~AgentLoop() = default;

  // ElasticAgent::run(), without its catch-all for bugs.
  int run();

 private:
  // How one round ended (supervise()'s kFinish action).
  struct RoundEnd {
    Outcome outcome = Outcome::kExit;
    int exit_code = 0;
    bool close_rendezvous = true;
  };

  // The steps, in order (agent_loop.cc). A step that fails for good throws StepFailed (run() records it).
  void prepare();
  rdzv::RendezvousInfo rendezvous();
  // Before a join: the node's health checks, standing aside and checking again while they fail.
  void await_healthy();
  // Before a generation that follows another, in `round`: the old one's GPU memory released
  // (agent/health/gpu_memory.h).
  void await_gpu_memory(int round);
  WorkerGroup assign(const rdzv::RendezvousInfo& round);
  void spawn(WorkerGroup& group);
  RoundEnd monitor(WorkerGroup& group);
  int finish(const WorkerGroup& group, const RoundEnd& end);
  // The event log's events of a round's end (lifecycle_log.h) and its reason for the metrics.
  std::string round_end_reason(const WorkerGroup& group) const;
  void record_exit(const WorkerGroup& group, const Event& e);
  void record_agent_exit(int exit_code, const std::string& detail);

  // Supervision (agent_actions.cc): what the other threads report, as the group's event; supervise() and its
  // actions, one function each.
  std::optional<GroupEvent> translate(const WorkerGroup& group, const Event& e) const;
  void dispatch(WorkerGroup& group, GroupEvent event);
  void execute(WorkerGroup& group, const Action& a, std::deque<GroupEvent>& results);
  void log(const Action& a);
  GroupEvent probe_liveness();
  GroupEvent publish_stop(const Action& a);
  std::optional<GroupEvent> mark_node_done();
  void print_summary(const WorkerGroup& group);
  void note_local_failure();
  GroupEvent capture_stacks(const WorkerGroup& group);
  void signal_process(const Action& a);

  AgentConfig config_;
  std::unique_ptr<rdzv::RendezvousHandler> rdzv_;
  JobState job_;  // changed by supervise() only
  EventQueue events_;
  JobEvents job_events_;
  LifecycleLog lifecycle_;               // --event_log_handler file:PATH, from prepare() on
  std::optional<AgentMetrics> metrics_;  // with --metrics_port
  Observer observer_;                    // status, stragglers, the metrics' gauges
  std::optional<RoundEnd> round_end_;    // set by the kFinish action of the current round
  bool foreground_terminal_ = false;     // stdin is a terminal with the agent in its foreground (terminal.h)
  std::optional<RunDirectory> run_dir_;  // from prepare() on
  std::optional<WorkerProcesses> processes_;      // from prepare() on
  std::unique_ptr<Nvml> nvml_;                    // from prepare() on, where libnvidia-ml loads
  std::map<std::string, uint64_t> gpu_baseline_;  // each GPU's used memory before the first workers
  int generations_ = 0;                           // worker generations started on this node
  std::unique_ptr<MetricsServer> metrics_server_;
  std::atomic<bool> ready_{false};  // /readyz: the workers of a formed round run
  RoundWatcher watcher_;            // declared last: stopped first, while the rest still exists
};

}  // namespace ddprun::agent
