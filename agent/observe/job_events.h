// JobEvents: torch elastic's agent events for --event-log-handler console (agent/observe/event_log.h has the
// format), recorded at the points where torch's agent records them: RENDEZVOUS and ASSIGN_WORKER_RANKS each
// round (with their durations, and the previous round's group rank and size, as torch records them before it
// updates its worker group), one WORKER event per worker when the job ends, then the agent's SUCCEEDED, or
// FAILED when a signal, the store, a spawn or a step of the agent ended it.
//
// Prints on stderr, only when the handler is "console" and $LOGLEVEL lets INFO through (events_printed).
//
// Also what torch's @record on torchrun's main leaves in the launcher's own TORCHELASTIC_ERROR_FILE (from the
// agent's environment, when set: ddprun run by TorchX or another launcher): when the job fails because of
// its workers, the root cause's error file (copy_root_cause_error_file); when a signal, the store, a spawn
// or a step of the agent ended it, torch's record of that exception (write_launcher_error_file).
// Threads: the loop's only. Never throws but std::bad_alloc. Internal to the agent loop.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/observe/event_log.h"
#include "agent/worker_group.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

class JobEvents {
 public:
  using Clock = std::chrono::steady_clock;

  // The job's run starts now; `job` gives the restarts done at each event.
  JobEvents(const AgentConfig& config, const std::string& run_id, const JobState& job);

  // torch's record_duration(state): how long the step that began at `since` took.
  void duration(const std::string& state, Clock::time_point since);
  // The events after this name the group rank and size of `round`.
  void enter_round(const rdzv::RendezvousInfo& round);
  // The agent's FAILED event with `error`, and `error` recorded in the launcher's error file; returns
  // exit_code.
  int agent_failed(int exit_code, const std::string& error);
  // The end of the job with the last round's `group`: a WORKER event per worker and the agent's SUCCEEDED
  // (and, when it failed, the root cause's error file copied to the launcher's); or, when a signal, the loss
  // of the store or a spawn failure ended it (an exception in torch's agent), the agent's FAILED only.
  void job_end(const WorkerGroup& group, bool succeeded);

 private:
  void record(const StatusEvent& e) const;

  void write_error_file(const std::string& error) const;

  const JobState& job_;
  std::filesystem::path error_file_;  // the launcher's own TORCHELASTIC_ERROR_FILE; "" = none
  bool printed_;
  StatusEvent event_;  // the agent's fields of the next event
  Clock::time_point start_ = Clock::now();
};

// One event per worker of a group that ended (`base` gives the agent's fields): SUCCEEDED when the group
// succeeded, else FAILED (with raw_error, exit_code, worker_pid) for a worker that failed on its own and
// TERMINATED for the others. Reads the failed workers' error files.
std::vector<StatusEvent> worker_status_events(const WorkerGroup& group, bool succeeded,
                                              const StatusEvent& base);

}  // namespace ddprun::agent
