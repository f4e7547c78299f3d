#include "agent/worker_group.h"

#include <algorithm>
#include <csignal>
#include <utility>

#include "agent/process/terminal.h"
#include "rendezvous/util/duration_text.h"

namespace ddprun::agent {

using rdzv::RoundStop;
using Kind = GroupEvent::Kind;

namespace {

// The actions of one transition, built up step by step.
class Plan {
 public:
  Plan(WorkerGroup& g, const SupervisionPolicy& p) : g_(g), p_(p) {}

  void log(Action::Level level, std::string text) {
    actions_.push_back(Action{.kind = Action::Kind::kLog, .level = level, .text = std::move(text)});
  }
  void info(std::string text) { log(Action::Level::kInfo, std::move(text)); }
  void warn(std::string text) { log(Action::Level::kWarn, std::move(text)); }
  void error(std::string text) { log(Action::Level::kError, std::move(text)); }
  void add(Action::Kind kind) { actions_.push_back(Action{.kind = kind}); }
  void signal_process(pid_t pid, int sig) {
    actions_.push_back(Action{.kind = Action::Kind::kSignalProcess, .signal = sig, .pid = pid});
  }
  void publish(RoundStop stop) {
    actions_.push_back(Action{.kind = Action::Kind::kPublishStop, .stop = std::move(stop)});
  }
  // Stops the workers once: a group already stopping is left to its stop.
  void stop_workers(int sig, std::chrono::milliseconds grace) {
    g_.in_exit_barrier = false;
    if (g_.state == GroupState::kStopping || g_.state == GroupState::kStopped) return;
    g_.state = GroupState::kStopping;
    actions_.push_back(Action{.kind = Action::Kind::kStopWorkers, .signal = sig, .grace = grace});
  }
  void stop_workers(int sig) { stop_workers(sig, p_.shutdown_grace); }
  void finish(Outcome outcome, int exit_code, bool close_rendezvous = true) {
    g_.state = GroupState::kStopped;
    actions_.push_back(Action{.kind = Action::Kind::kFinish,
                              .outcome = outcome,
                              .exit_code = exit_code,
                              .close_rendezvous = close_rendezvous});
  }
  std::vector<Action> take() { return std::move(actions_); }

 private:
  WorkerGroup& g_;
  const SupervisionPolicy& p_;
  std::vector<Action> actions_;
};

int node_of(const WorkerGroup& g) {
  return g.round.group_rank;
}

// The job ends by `sig` as if the agent had got it: every worker gets it, the peers are told.
void shut_down(WorkerGroup& g, int sig, Plan& plan) {
  const int node = node_of(g);
  g.signal = sig;
  plan.stop_workers(sig);
  plan.publish(RoundStop{RoundStop::Kind::kShutdown, node,
                         "node " + std::to_string(node) + " got " + signal_name(sig), 128 + sig});
}

void on_worker_exited(WorkerGroup& g, const JobState& job, const GroupEvent& e, const SupervisionPolicy& p,
                      Plan& plan) {
  Worker& w = g.workers.at(static_cast<size_t>(e.local_rank));
  w.status = e.status;
  if (g.state == GroupState::kStopping) {
    w.state = WorkerState::kStopped;
    // A worker of a group being stopped for a failure that failed by itself meanwhile (its @record error file
    // says so; the agent's SIGTERM writes none) is a failure too: the root cause is chosen among them by
    // timestamp (failure_summary.h), as torchrun does among the failures of one poll.
    if (!g.failures.empty() && !e.status.success() && e.failure && !e.failure->error_file.empty()) {
      g.failures.push_back(*e.failure);
    }
    return;
  }
  if (e.status.success()) {
    w.state = WorkerState::kSucceeded;
    for (const Worker& other : g.workers) {
      if (other.state != WorkerState::kSucceeded) return;
    }
    plan.info("all " + std::to_string(g.workers.size()) + " local workers succeeded");
    g.state = GroupState::kSucceeded;
    g.in_exit_barrier = !g.stop.has_value();
    plan.add(Action::Kind::kMarkNodeDone);
    if (g.stop) plan.stop_workers(SIGTERM);  // the round already ended (kDone by the others): nothing waits
    return;
  }
  if (w.launch.stdin_mode == WorkerLaunch::Stdin::kTerminal && is_terminal_interrupt(e.status.signal)) {
    // Ctrl-C (Ctrl-\) reached only the worker that holds the terminal: the user's interrupt of the job.
    w.state = WorkerState::kStopped;
    plan.warn("local_rank " + std::to_string(w.local_rank) + " (pid " + std::to_string(w.pid) +
              "), which holds the terminal, ended by " + signal_name(e.status.signal) +
              ": interrupting the job, forwarding it to the workers (grace " +
              duration_text(p.shutdown_grace) + ")");
    return shut_down(g, e.status.signal, plan);
  }
  w.state = WorkerState::kFailed;
  WorkerFailure f = e.failure.value_or(WorkerFailure{.host = job.host,
                                                     .rank = w.rank,
                                                     .local_rank = w.local_rank,
                                                     .exit_code = e.status.exit_code,
                                                     .signal = e.status.signal,
                                                     .pid = w.pid});
  if (auto note = g.notes.find(w.local_rank); note != g.notes.end()) {
    f.message = f.message.empty() ? note->second : note->second + "; " + f.message;
    f.stacks = g.stack_summary;
  }
  g.failures.push_back(std::move(f));
  g.steps = std::max(g.steps, e.steps);
  plan.error("worker local_rank " + std::to_string(w.local_rank) + " (rank " + std::to_string(w.rank) +
             ", pid " + std::to_string(w.pid) + ") failed: " + e.status.describe());
  plan.stop_workers(SIGTERM);
  plan.add(Action::Kind::kProbeLiveness);
}

// With --max_no_progress_restarts: whether this failed attempt is the last of too many in a row that made no
// progress; the job then stops everywhere with kExitNoProgress ("do not requeue") instead of restarting.
bool stop_without_progress(WorkerGroup& g, const JobState& job, const SupervisionPolicy& p, Plan& plan) {
  const int limit = p.max_no_progress_restarts;
  if (limit <= 0) return false;
  const int in_a_row = g.steps > job.previous_steps ? 0 : job.attempts_without_progress + 1;
  if (in_a_row < limit) return false;
  const std::string detail = std::to_string(in_a_row) +
                             " failed attempt(s) in a row made no progress (step " + std::to_string(g.steps) +
                             ", previous attempt " + std::to_string(job.previous_steps) +
                             "; --max_no_progress_restarts " + std::to_string(limit) + ")";
  plan.error(detail + ": stopping the job with exit code " + std::to_string(kExitNoProgress) +
             " (do not requeue)");
  plan.publish(RoundStop{RoundStop::Kind::kShutdown, node_of(g), detail, kExitNoProgress});
  return true;
}

void on_liveness_probed(WorkerGroup& g, const JobState& job, const GroupEvent& e, const SupervisionPolicy& p,
                        Plan& plan) {
  if (g.stop || g.failures.empty()) return;  // a peer's stop came first: nothing to publish
  if (!e.dead_nodes.empty()) {
    // The failure is the echo of a lost node (its peers see the loss as collective errors): re-form
    // without it, not counted as a restart. The probe only reads what the store knows; a loss it cannot see
    // yet is found by the next round, which gives the restart back (give_back_restart).
    std::string which;
    for (int d : e.dead_nodes) which += (which.empty() ? "" : ", ") + std::to_string(d);
    g.failures.clear();
    plan.publish(RoundStop{RoundStop::Kind::kMembership, node_of(g), "node(s) " + which + " lost", 0});
    return;
  }
  if (stop_without_progress(g, job, p, plan)) return;
  const WorkerFailure& first = g.failures.front();
  ExitStatus status{.exit_code = first.exit_code, .signal = first.signal};
  const std::string what = g.hung ? first.message : status.describe();
  plan.publish(RoundStop{RoundStop::Kind::kFailed, node_of(g),
                         "rank " + std::to_string(first.rank) + " on " + job.host + ": " + what,
                         status.shell_code()});
}

void on_round_stopped(WorkerGroup& g, const GroupEvent& e, Plan& plan) {
  if (!g.stop) g.stop = e.stop;
  const RoundStop& s = *g.stop;
  if (s.kind != RoundStop::Kind::kDone && s.node_rank != node_of(g)) {
    plan.warn("round " + std::to_string(g.round.round) + " ended" +
              (s.node_rank >= 0 ? " by node " + std::to_string(s.node_rank) : std::string()) + ": " +
              s.detail);
  }
  // A peer's signal reaches these workers too (SIGUSR1 must not become SIGTERM); else SIGTERM.
  const int sig = shutdown_signal(s);
  plan.stop_workers(sig ? sig : SIGTERM);
}

void on_store_lost(WorkerGroup& g, const GroupEvent& e, Plan& plan) {
  if (g.stop) return;  // the round already ended; the store host may have left
  if (g.state == GroupState::kSucceeded) {
    // Like torchrun's exit barrier: this node's work is done, a store gone meanwhile is not a failure.
    plan.warn("exit barrier: lost the rendezvous store (" + e.error + "); exiting with success");
    g.stop = RoundStop{RoundStop::Kind::kDone, node_of(g), "store gone after success", 0};
    plan.stop_workers(SIGTERM);
    return;
  }
  plan.error("lost the rendezvous store: " + e.error);
  g.store_lost = true;
  g.stop = RoundStop{RoundStop::Kind::kFailed, node_of(g), "store lost", kExitStoreFailed};
  plan.stop_workers(SIGTERM);
}

void on_signal(WorkerGroup& g, const GroupEvent& e, const SupervisionPolicy& p, Plan& plan) {
  const int node = node_of(g);
  // A peer stopped the round because it got this same signal: under Slurm every node gets it, a few ms
  // apart. Not a second signal: the workers keep their grace.
  if (g.signal == 0 && g.stop && g.stop->node_rank != node && shutdown_signal(*g.stop) == e.signal) {
    g.signal = e.signal;
    plan.warn("received " + signal_name(e.signal) + " (already forwarded: node " +
              std::to_string(g.stop->node_rank) + " got it first)");
    return;
  }
  if (g.signal != 0 || g.state == GroupState::kStopping) {
    const std::string after = g.signal == 0          ? " while the workers were being stopped"
                              : g.signal == e.signal ? " again"
                                                     : " after " + signal_name(g.signal);
    plan.warn("received " + signal_name(e.signal) + after + ": killing the workers now");
    plan.add(Action::Kind::kKillWorkers);
    if (g.signal == 0) g.signal = e.signal;
    return;
  }
  plan.warn("received " + signal_name(e.signal) + ": forwarding it to the workers (grace " +
            duration_text(p.shutdown_grace) + ")");
  shut_down(g, e.signal, plan);
}

void on_publish_result(WorkerGroup& g, const GroupEvent& e, Plan& plan, const RoundStop& attempted) {
  if (e.kind == Kind::kStopPublished) {
    if (!g.stop) g.stop = e.stop;
    return;
  }
  if (g.spawn_failed) return;  // exiting with kExitSpawnFailed anyway
  plan.error("cannot publish the end of round " + std::to_string(g.round.round) +
             " to the store: " + e.error);
  if (!g.stop) g.stop = attempted;
  g.store_lost = true;
}

void on_hung(WorkerGroup& g, const SupervisionPolicy& p, Plan& plan) {
  if (g.state != GroupState::kHealthy || g.hung) return;
  g.hung = true;
  plan.error("no rank made progress for " + duration_text(p.hang_timeout) +
             " (--hang_timeout): capturing every rank's stack, then stopping the group");
  plan.add(Action::Kind::kCaptureStacks);
}

void on_deadline_missed(WorkerGroup& g, const GroupEvent& e, Plan& plan) {
  const std::string sig = e.signal > 0 ? signal_name(e.signal) : "no signal";
  if (e.local_rank < 0) {
    plan.warn("pid " + std::to_string(e.pid) + " (not a worker) missed its deadline (scope " + e.scope +
              "): " + (e.signal > 0 ? "sending it " + sig : "it asked for no signal, nothing done"));
    if (e.signal > 0) plan.signal_process(e.pid, e.signal);
    return;
  }
  const Worker& w = g.workers.at(static_cast<size_t>(e.local_rank));
  if (g.state != GroupState::kHealthy || w.state != WorkerState::kHealthy) return;
  if (e.signal <= 0) {
    plan.warn("rank " + std::to_string(w.rank) + " missed its deadline (scope " + e.scope +
              ") and asked for no signal: nothing done");
    return;
  }
  g.notes[w.local_rank] = "rank " + std::to_string(w.rank) + " missed its deadline (scope " + e.scope + ")";
  plan.error(g.notes[w.local_rank] + ": capturing every rank's stack, then sending " + sig + " to pid " +
             std::to_string(e.pid));
  plan.add(Action::Kind::kCaptureStacks);
  plan.signal_process(e.pid, e.signal);
}

void on_stacks_captured(WorkerGroup& g, const JobState& job, const GroupEvent& e, const SupervisionPolicy& p,
                        Plan& plan) {
  std::string summary = summarize_stacks(e.stacks);
  if (!summary.empty()) plan.error("where the ranks are: " + summary);
  g.stack_summary.clear();
  for (size_t start = 0; start < summary.size();) {  // one group per line for the failure summary
    size_t end = summary.find(" · ", start);
    g.stack_summary += summary.substr(start, end - start) + "\n";
    start = end == std::string::npos ? summary.size() : end + std::string(" · ").size();
  }
  if (!g.hung || g.state != GroupState::kHealthy) return;
  // The failure is the node's; it is named after the odd rank out (the first group of the summary).
  const Worker* odd = &g.workers.front();
  if (auto groups = group_stacks(e.stacks); !groups.empty()) {
    for (const Worker& w : g.workers) {
      if (w.rank == groups.front().second.front()) odd = &w;
    }
  }
  g.failures.push_back(WorkerFailure{
      .time = e.time,
      .host = job.host,
      .rank = odd->rank,
      .local_rank = odd->local_rank,
      .exit_code = kExitHung,
      .pid = odd->pid,
      .message = "no progress from any rank for " + duration_text(p.hang_timeout) + " (--hang_timeout)",
      .stacks = g.stack_summary});
  plan.stop_workers(SIGTERM);
  plan.add(Action::Kind::kProbeLiveness);
}

void on_group_stopped(WorkerGroup& g, JobState& job, const GroupEvent& e, const SupervisionPolicy& p,
                      Plan& plan) {
  if (g.signal != 0) return plan.finish(Outcome::kExit, p.exit_code_of_signal(g.signal), false);
  if (!g.failures.empty()) plan.add(Action::Kind::kPrintSummary);
  if (g.spawn_failed) return plan.finish(Outcome::kExit, kExitSpawnFailed, false);
  if (g.store_lost) return plan.finish(Outcome::kExit, kExitStoreFailed);
  if (!g.stop && !g.failures.empty()) {  // a failure whose publication never reported back: still a failure
    g.stop = RoundStop{RoundStop::Kind::kFailed, node_of(g), "local failure", 1};
  }
  if (!g.stop || g.stop->kind == RoundStop::Kind::kDone)
    return plan.finish(Outcome::kSucceeded, kExitSuccess);
  const RoundStop& s = *g.stop;
  if (s.kind == RoundStop::Kind::kMembership) {
    plan.info("membership changed (" + s.detail + "): joining the next round");
    return plan.finish(Outcome::kRejoin, kExitSuccess);
  }
  if (s.kind == RoundStop::Kind::kShutdown) {
    const int sig = shutdown_signal(s);
    return plan.finish(Outcome::kExit, sig ? p.exit_code_of_signal(sig) : s.exit_code, false);
  }
  // kFailed: the first failure seen here stopped the group, and the other nodes got its code too.
  int code = s.exit_code;
  if (!g.failures.empty()) {
    const WorkerFailure& first = g.failures.front();
    code = first.signal != 0 ? 128 + first.signal : first.exit_code;
  }
  if (code == 0) code = 1;
  if (s.node_rank == node_of(g)) plan.add(Action::Kind::kNoteLocalFailure);
  if (p.max_no_progress_restarts > 0) {
    const uint64_t steps = std::max(g.steps, e.steps);
    job.attempts_without_progress = steps > job.previous_steps ? 0 : job.attempts_without_progress + 1;
    job.previous_steps = steps;
  }
  if (job.restarts_done >= p.max_restarts) return plan.finish(Outcome::kExit, code);
  ++job.restarts_done;
  job.restart_counted = true;
  plan.warn("restarting the worker group (" + std::to_string(job.restarts_done) + " of " +
            std::to_string(p.max_restarts) + " restarts)");
  plan.finish(Outcome::kRestart, code);
}

}  // namespace

int shutdown_signal(const RoundStop& stop) {
  bool by_signal =
      stop.kind == RoundStop::Kind::kShutdown && stop.exit_code > 128 && stop.exit_code <= 128 + SIGRTMAX;
  return by_signal ? stop.exit_code - 128 : 0;
}

const char* worker_state_name(WorkerState s) {
  switch (s) {
    case WorkerState::kHealthy:
      return "running";
    case WorkerState::kSucceeded:
      return "succeeded";
    case WorkerState::kFailed:
      return "failed";
    case WorkerState::kStopped:
      return "stopped";
  }
  return "unknown";
}

std::string give_back_restart(JobState& job, const rdzv::RendezvousInfo& round, const SupervisionPolicy& p) {
  const bool counted = std::exchange(job.restart_counted, false);
  if (!counted || round.dropped_nodes.empty() || job.restarts_done == 0) return "";
  --job.restarts_done;
  std::string who;
  for (const auto& id : round.dropped_nodes) who += (who.empty() ? "" : ", ") + id;
  return "round " + std::to_string(round.round) + ": node(s) " + who +
         " of the previous round did not come back; the restart is charged to their loss, not counted (" +
         std::to_string(job.restarts_done) + " of " + std::to_string(p.max_restarts) + " restarts used)";
}

std::vector<Action> supervise(WorkerGroup& g, JobState& job, const GroupEvent& e,
                              const SupervisionPolicy& p) {
  Plan plan(g, p);
  if (g.state == GroupState::kStopped) return {};  // finished: late results change nothing
  switch (e.kind) {
    case Kind::kWorkerExited:
      on_worker_exited(g, job, e, p, plan);
      break;
    case Kind::kSpawnFailed: {
      plan.error("cannot start a worker: " + e.error);
      g.spawn_failed = true;
      plan.stop_workers(SIGKILL, std::chrono::milliseconds(0));
      plan.publish(RoundStop{RoundStop::Kind::kShutdown, node_of(g), e.error, kExitSpawnFailed});
      break;
    }
    case Kind::kRoundStopped:
      on_round_stopped(g, e, plan);
      break;
    case Kind::kStoreLost:
      on_store_lost(g, e, plan);
      break;
    case Kind::kSignal:
      on_signal(g, e, p, plan);
      break;
    case Kind::kGroupStopped:
      on_group_stopped(g, job, e, p, plan);
      break;
    case Kind::kBarrierTimeout:
      if (!g.in_exit_barrier) break;
      plan.warn("exit barrier: the other nodes did not finish within " +
                duration_text(p.exit_barrier_timeout) + "; exiting with success");
      g.stop = RoundStop{RoundStop::Kind::kDone, node_of(g), "exit barrier timed out", 0};
      plan.stop_workers(SIGTERM);
      break;
    case Kind::kLivenessProbed:
      on_liveness_probed(g, job, e, p, plan);
      break;
    case Kind::kStopPublished:
    case Kind::kPublishFailed:
      on_publish_result(g, e, plan, e.stop);
      break;
    case Kind::kHung:
      on_hung(g, p, plan);
      break;
    case Kind::kDeadlineMissed:
      on_deadline_missed(g, e, plan);
      break;
    case Kind::kStacksCaptured:
      on_stacks_captured(g, job, e, p, plan);
      break;
    case Kind::kNodeDoneFailed:
      plan.warn("exit barrier: " + e.error);
      if (!g.stop) g.stop = RoundStop{RoundStop::Kind::kDone, node_of(g), "store gone after success", 0};
      plan.stop_workers(SIGTERM);
      break;
  }
  return plan.take();
}

}  // namespace ddprun::agent
