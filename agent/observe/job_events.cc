#include "agent/observe/job_events.h"

#include <spdlog/spdlog.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "agent/observe/failure_summary.h"

namespace ddprun::agent {

JobEvents::JobEvents(const AgentConfig& config, const std::string& run_id, const JobState& job)
    : job_(job), printed_(events_printed(config.event_log_handler, std::getenv("LOGLEVEL"))) {
  if (auto it = config.base_env.find("TORCHELASTIC_ERROR_FILE"); it != config.base_env.end())
    error_file_ = it->second;
  if (!printed_) return;
  event_ = StatusEvent{.run_id = run_id,
                       .role = config.role,
                       .hostname = local_fqdn(),
                       .rdzv_backend = config.rdzv_backend,
                       .entry_point = config.entry_point};
}

void JobEvents::record(const StatusEvent& e) const {
  if (!printed_) return;
  const std::string line = status_event_json(e) + "\n";
  if (::write(STDERR_FILENO, line.data(), line.size()) < 0)
    spdlog::debug("cannot print an event: {}", strerror(errno));
}

void JobEvents::duration(const std::string& state, Clock::time_point since) {
  event_.state = state;
  event_.agent_restarts = job_.restarts_done;
  event_.duration_ms = std::chrono::duration<double, std::milli>(Clock::now() - since).count();
  record(event_);
  event_.duration_ms.reset();
}

void JobEvents::enter_round(const rdzv::RendezvousInfo& round) {
  event_.group_rank = round.group_rank;
  event_.group_world_size = round.group_world_size;
}

int JobEvents::agent_failed(int exit_code, const std::string& error) {
  event_.state = "FAILED";
  event_.agent_restarts = job_.restarts_done;
  event_.total_run_time = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start_).count();
  event_.raw_error = error;
  record(event_);
  write_error_file(error);
  return exit_code;
}

void JobEvents::write_error_file(const std::string& error) const {
  if (error_file_.empty()) return;
  if (auto problem = write_launcher_error_file(error, error_file_); !problem.empty())
    spdlog::warn("{}", problem);
}

void JobEvents::job_end(const WorkerGroup& group, bool succeeded) {
  if (group.signal != 0) {
    agent_failed(0, "SignalException: Process " + std::to_string(::getpid()) +
                        " got signal: " + std::to_string(group.signal));
    return;
  }
  if (group.store_lost || group.spawn_failed) {
    agent_failed(0, group.store_lost ? "the rendezvous store was lost" : "a worker could not be started");
    return;
  }
  if (!succeeded && !group.failures.empty() && !error_file_.empty()) {
    const auto problem = copy_root_cause_error_file(group.failures[root_cause(group.failures)], error_file_);
    if (!problem.empty()) spdlog::warn("{}", problem);
  }
  event_.agent_restarts = job_.restarts_done;
  event_.total_run_time = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start_).count();
  for (const StatusEvent& e : worker_status_events(group, succeeded, event_)) record(e);
  event_.state = "SUCCEEDED";  // the agent ran to the end, whatever its workers did
  record(event_);
}

std::vector<StatusEvent> worker_status_events(const WorkerGroup& group, bool succeeded,
                                              const StatusEvent& base) {
  std::vector<StatusEvent> out;
  for (const Worker& w : group.workers) {
    StatusEvent e = base;
    e.from_worker = true;
    e.raw_error.reset();
    e.duration_ms.reset();
    e.worker = StatusEvent::WorkerFields{.global_rank = w.rank,
                                         .local_rank = w.local_rank,
                                         .role_rank = w.rank,
                                         .role_world_size = group.round.world_size,
                                         .worker_id = w.pid};
    if (succeeded) {
      e.state = "SUCCEEDED";
    } else if (w.state == WorkerState::kFailed) {
      e.state = "FAILED";
      e.raw_error = error_file_json(w.paths.error_file);
      e.worker->exit_code = w.status.signal != 0 ? -w.status.signal : w.status.exit_code;
      e.worker->worker_pid = w.pid;
    } else {
      e.state = "TERMINATED";  // stopped by the agent, or done while another worker failed
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace ddprun::agent
