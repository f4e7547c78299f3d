// AgentLoop's supervision: what the other threads report becomes the group's event, supervise() decides, and
// each action it returns is done by one function here; the results of actions (a store reply, a probe) are
// events too, handled in order before the loop waits again.
#include <spdlog/spdlog.h>
#include <string.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <deque>

#include "agent/loop/agent_loop.h"
#include "agent/observe/failure_summary.h"
#include "agent/watchdog/progress_monitor.h"
#include "agent/watchdog/stack_capture.h"

namespace ddprun::agent {

namespace {

// Where torch's flight recorder of worker `w` puts a file: the prefix its environment names (torch >= 2.8
// reads the TORCH_FR_* name first) and its rank; "" when neither is set (no --hang_timeout, nor the user's).
std::string flight_recorder_path(const Worker& w, const char* name, const char* older_name) {
  auto it = w.launch.env.find(name);
  if (it == w.launch.env.end()) it = w.launch.env.find(older_name);
  return it == w.launch.env.end() ? "" : it->second + std::to_string(w.rank);
}

// The failure of worker `w` that exited as `e` says: its error file (torch's @record), else its stderr's
// tail.
WorkerFailure failure_of(const Worker& w, const Event& e, const std::string& host) {
  WorkerFailure f{.time = e.time,
                  .host = host,
                  .rank = w.rank,
                  .local_rank = w.local_rank,
                  .exit_code = e.status.exit_code,
                  .signal = e.status.signal,
                  .pid = e.pid};
  if (auto ef = read_error_file(w.paths.error_file)) {
    f.error_file = w.paths.error_file.string();
    f.message = ef->message;
    f.traceback = ef->traceback;
    if (ef->timestamp) f.time = *ef->timestamp;
  } else {
    f.traceback = read_tail(w.paths.stderr_file, 20);
  }
  const std::string trace =
      flight_recorder_path(w, "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE");
  std::error_code ec;
  if (!trace.empty() && std::filesystem::is_regular_file(trace, ec)) f.nccl_trace = trace;
  return f;
}

// The largest step any local rank wrote to its DDPRUN_PROGRESS_FILE (0: none wrote one).
uint64_t local_steps(const WorkerGroup& group) {
  uint64_t steps = 0;
  for (const Worker& w : group.workers) {
    if (auto beat = read_heartbeat(w.paths.progress_file)) steps = std::max(steps, beat->step);
  }
  return steps;
}

}  // namespace

// nullopt for a watcher's report about an earlier round (it may arrive after that round ended).
std::optional<GroupEvent> AgentLoop::translate(const WorkerGroup& group, const Event& e) const {
  using K = GroupEvent::Kind;
  switch (e.kind) {
    case Event::Kind::kWorkerExited: {
      GroupEvent g{.kind = K::kWorkerExited, .local_rank = e.local_rank, .status = e.status};
      if (!e.status.success()) {
        g.failure = failure_of(group.workers.at(static_cast<size_t>(e.local_rank)), e, job_.host);
        if (config_.supervision.max_no_progress_restarts > 0) g.steps = local_steps(group);
      }
      return g;
    }
    case Event::Kind::kGroupStopped: {
      GroupEvent g{.kind = K::kGroupStopped};
      if (config_.supervision.max_no_progress_restarts > 0) g.steps = local_steps(group);
      return g;
    }
    case Event::Kind::kSignal:
      return GroupEvent{.kind = K::kSignal, .signal = e.signal};
    case Event::Kind::kRoundStopped:
      if (e.round != group.round.round) return std::nullopt;
      return GroupEvent{.kind = K::kRoundStopped, .stop = e.stop};
    case Event::Kind::kWatcherError:
      if (e.round != group.round.round) return std::nullopt;
      return GroupEvent{.kind = K::kStoreLost, .error = e.error};
    case Event::Kind::kDeadlineMissed: {
      GroupEvent g{
          .kind = K::kDeadlineMissed, .local_rank = -1, .signal = e.signal, .pid = e.pid, .scope = e.error};
      for (const Worker& w : group.workers) {
        if (w.pid == e.pid) g.local_rank = w.local_rank;
      }
      return g;
    }
  }
  return std::nullopt;
}

void AgentLoop::dispatch(WorkerGroup& group, GroupEvent event) {
  std::deque<GroupEvent> pending{std::move(event)};
  while (!pending.empty()) {
    GroupEvent e = std::move(pending.front());
    pending.pop_front();
    for (const Action& a : supervise(group, job_, e, config_.supervision)) execute(group, a, pending);
  }
}

// Rendezvous failures (RendezvousError: the handler translates the store's) become events; anything else is a
// bug and propagates to ElasticAgent::run()'s catch-all.
void AgentLoop::execute(WorkerGroup& group, const Action& a, std::deque<GroupEvent>& results) {
  using K = Action::Kind;
  switch (a.kind) {
    case K::kLog:
      return log(a);
    case K::kStopWorkers:
      return processes_->stop(a.signal, a.grace);
    case K::kKillWorkers:
      return processes_->kill();
    case K::kProbeLiveness:
      return results.push_back(probe_liveness());
    case K::kPublishStop:
      return results.push_back(publish_stop(a));
    case K::kMarkNodeDone:
      if (auto failed = mark_node_done()) results.push_back(std::move(*failed));
      return;
    case K::kPrintSummary:
      return print_summary(group);
    case K::kNoteLocalFailure:
      return note_local_failure();
    case K::kFinish:
      round_end_ = RoundEnd{a.outcome, a.exit_code, a.close_rendezvous};
      return;
    case K::kCaptureStacks:
      return results.push_back(capture_stacks(group));
    case K::kSignalProcess:
      return signal_process(a);
  }
}

void AgentLoop::log(const Action& a) {
  spdlog::log(a.level == Action::Level::kError  ? spdlog::level::err
              : a.level == Action::Level::kWarn ? spdlog::level::warn
                                                : spdlog::level::info,
              "{}", a.text);
}

// Which nodes the rendezvous knows gone (none known when the store cannot say); never waits.
GroupEvent AgentLoop::probe_liveness() {
  GroupEvent probed{.kind = GroupEvent::Kind::kLivenessProbed};
  try {
    probed.dead_nodes = rdzv_->lost_nodes();
  } catch (const rdzv::RendezvousError& e) {
    spdlog::warn("cannot tell which nodes are alive: {}", e.what());
  }
  return probed;
}

// Ends the round for every node; the stop that won (maybe a peer's), or the failure to publish.
GroupEvent AgentLoop::publish_stop(const Action& a) {
  try {
    return GroupEvent{.kind = GroupEvent::Kind::kStopPublished, .stop = rdzv_->stop_round(a.stop)};
  } catch (const rdzv::RendezvousError& e) {
    return GroupEvent{.kind = GroupEvent::Kind::kPublishFailed, .stop = a.stop, .error = e.what()};
  }
}

// Tells the rendezvous this node succeeded; an event only when that failed.
std::optional<GroupEvent> AgentLoop::mark_node_done() {
  try {
    rdzv_->node_done();
    return std::nullopt;
  } catch (const rdzv::RendezvousError& e) {
    return GroupEvent{.kind = GroupEvent::Kind::kNodeDoneFailed, .error = e.what()};
  }
}

void AgentLoop::print_summary(const WorkerGroup& group) {
  std::fprintf(stderr, "%s", format_failure_summary(group.failures, config_.script_name).c_str());
}

// This node caused the failure: the c10d backend's cooldown counts it.
void AgentLoop::note_local_failure() {
  observer_.count_caused_restart();
  try {
    rdzv_->note_local_failure();
  } catch (const rdzv::RendezvousError& e) {
    spdlog::warn("cannot record this node's failure in the store: {}", e.what());
  }
}

// Asks every running worker where it is (Python's faulthandler, NCCL's flight recorder).
GroupEvent AgentLoop::capture_stacks(const WorkerGroup& group) {
  std::vector<StackTarget> targets;
  for (const Worker& w : group.workers) {
    if (w.state != WorkerState::kHealthy || w.pid <= 0) continue;
    const std::string pipe =
        flight_recorder_path(w, "TORCH_FR_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE");
    targets.push_back({w.rank, w.pid, w.paths.stderr_file, pipe.empty() ? "" : pipe + ".pipe"});
  }
  return GroupEvent{.kind = GroupEvent::Kind::kStacksCaptured,
                    .stacks = agent::capture_stacks(targets, stack_dump_signal()),
                    .time = unix_now()};
}

// A FileTimer's request: its signal to that one process.
void AgentLoop::signal_process(const Action& a) {
  if (::kill(a.pid, a.signal) != 0 && errno != ESRCH) {
    spdlog::error("cannot send {} to pid {}: {}", signal_name(a.signal), a.pid, std::strerror(errno));
  }
}

}  // namespace ddprun::agent
