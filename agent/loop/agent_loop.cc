#include "agent/loop/agent_loop.h"

#include <spdlog/spdlog.h>

#include <csignal>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "agent/exit_codes.h"
#include "agent/health/gpu_memory.h"
#include "agent/health/health_check.h"
#include "agent/loop/progress_sampler.h"
#include "agent/process/terminal.h"
#include "agent/worker_launches.h"
#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

using Clock = std::chrono::steady_clock;
using json = EventFields;  // the event log's fields

namespace {

// A step that ends the job for good: the exit code, and the error torch's FAILED event reports.
struct StepFailed {
  int exit_code;
  std::string error;
};

// This node waited as a hot spare and the job finished without needing it: the agent exits 0.
struct SpareUnused {};

// At the agent's end, how long its last status document may take to reach the store.
constexpr std::chrono::milliseconds kFinalStatusWait{2000};

}  // namespace

AgentLoop::AgentLoop(AgentConfig config, std::unique_ptr<rdzv::RendezvousHandler> rendezvous)
    : config_(std::move(config)),
      rdzv_(std::move(rendezvous)),
      job_{.host = local_hostname()},
      job_events_(config_, rdzv_->run_id(), job_),
      observer_(config_, *rdzv_, job_, lifecycle_),
      watcher_(*rdzv_, events_) {}

int AgentLoop::run() {
  try {
    prepare();
    while (true) {
      WorkerGroup group = assign(rendezvous());
      spawn(group);
      const RoundEnd end = monitor(group);
      // A restart (supervise() counted it) or a membership change: the next round.
      if (end.outcome == Outcome::kRestart || end.outcome == Outcome::kRejoin) continue;
      return finish(group, end);
    }
  } catch (const StepFailed& failed) {
    observer_.set_group(nullptr);
    observer_.set_state("failed", failed.error);
    observer_.flush(kFinalStatusWait);
    record_agent_exit(failed.exit_code, failed.error);
    return job_events_.agent_failed(failed.exit_code, failed.error);
  } catch (const SpareUnused&) {
    observer_.set_state("done", "the job finished while this node waited as a hot spare");
    observer_.flush(kFinalStatusWait);
    record_agent_exit(kExitSuccess, "a hot spare the job did not need");
    try {
      rdzv_->shutdown();
    } catch (const rdzv::RendezvousError& e) {
      spdlog::debug("rendezvous shutdown: {}", e.what());
    }
    run_dir_->remove_if_temporary();
    return kExitSuccess;
  }
}

// The run directory with its hooks, the FileTimer, then the io thread with the agent's signals.
void AgentLoop::prepare() {
  // A closed stdout (a pager that quit) must not kill the agent before it stops its workers.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    run_dir_.emplace(RunDirectory::create(config_, rdzv_->run_id()));
  } catch (const std::filesystem::filesystem_error& e) {
    const std::string error = std::string("cannot create the log directory: ") + e.what();
    spdlog::error("{}; check --log_dir", error);
    throw StepFailed{kExitSpawnFailed, error};
  }
  if (!config_.event_log_file.empty()) {
    try {
      lifecycle_.open(config_.event_log_file, rdzv_->run_id(), job_.host);
    } catch (const std::system_error& e) {
      spdlog::error("{}; check the path of --event_log_handler file:PATH", e.what());
      throw StepFailed{kExitUsage, e.what()};
    }
  }
  processes_.emplace(config_, events_, run_dir_->prestart_stub());
  try {
    run_dir_->write_hooks(config_);
    if (file_timer_enabled(config_))
      processes_->serve_file_timer(timer_file(config_, run_dir_->layout().run_dir()));
  } catch (const std::exception& e) {
    // The hooks (stack capture, --prestart's stub) or torch's FileTimer (TORCHELASTIC_TIMER_FILE).
    const std::string error = std::string("cannot set up the workers' watchdog: ") + e.what();
    spdlog::error("{}", error);
    throw StepFailed{kExitSpawnFailed, error};
  }
  processes_->start();
  foreground_terminal_ = stdin_is_foreground_terminal();
  if (config_.metrics_port != 0) {
    metrics_.emplace();
    observer_.attach_metrics(&*metrics_);
    try {
      metrics_server_ = std::make_unique<MetricsServer>(
          config_.metrics_addr, config_.metrics_port, [this] { return metrics_->text(); },
          [this] { return ready_.load(); });
    } catch (const std::system_error& e) {
      spdlog::error("{}; choose another --metrics_port (or --metrics_addr)", e.what());
      throw StepFailed{kExitUsage, e.what()};
    }
    spdlog::info("serving /metrics, /healthz and /readyz on port {}", metrics_server_->port());
  }
  if (config_.health.builtin || config_.health.gpu_memory_wait.count() > 0) {
    std::string why;
    nvml_ = Nvml::load(config_.base_env, why);
    if (!nvml_) {
      spdlog::debug("no NVML ({}): GPUs are neither checked nor waited for", why);
      return;
    }
    gpu_baseline_ =
        gpu_memory_used(*nvml_, node_gpus(config_.base_env, static_cast<int>(config_.workers.size())).ids);
    spdlog::info("NVML sees {} GPUs; this node's local ranks use {} of them", nvml_->device_count(),
                 gpu_baseline_.size());
  }
}

void AgentLoop::await_healthy() {
  const HealthPolicy& h = config_.health;
  if (!h.builtin && h.command.empty()) return;
  for (int failed = 0;;) {
    const HealthReport report = check_health(config_, nvml_.get());
    if (report.healthy()) {
      if (failed > 0) {
        observer_.set_state("forming");
        spdlog::info(
            "this node is healthy again (checked in {}): it joins the job, as a spare if the job is full",
            duration_text(report.elapsed));
      } else {
        spdlog::debug("health checks passed in {}", duration_text(report.elapsed));
      }
      return;
    }
    const std::string why = report.summary();
    if (++failed >= h.attempts) {
      spdlog::error("this node failed {} health checks in a row, the last: {}; the agent exits with code {}",
                    failed, why, static_cast<int>(kExitUnhealthy));
      throw StepFailed{kExitUnhealthy, "this node is unhealthy: " + why};
    }
    spdlog::warn(
        "this node is unhealthy: {}. It stands aside (the job goes on without it where a hot spare or "
        "--nnodes "
        "MIN:MAX allows) and checks again in {} ({} of {} checks failed)",
        why, duration_text(h.retry_interval), failed, h.attempts);
    observer_.set_state("unhealthy", why);
    lifecycle_.record("node_unhealthy", {{"reason", why}, {"attempt", failed}, {"attempts", h.attempts}});
    try {
      rdzv_->stand_aside(why);
    } catch (const rdzv::RendezvousError& e) {
      spdlog::warn("cannot tell the job that this node stands aside: {}", e.what());
    }
    std::this_thread::sleep_for(h.retry_interval);  // a signal ends the agent meanwhile (exit_on_signals)
  }
}

// Runs while the watcher of `round` heartbeats for this node (a wait of up to --gpu_memory_wait must not get
// it declared lost); a signal, or the watcher's report that the round stopped, ends it at once (monitor()
// handles the event). Reports about earlier rounds, still queued, do not.
void AgentLoop::await_gpu_memory(int round) {
  if (!nvml_ || gpu_baseline_.empty() || config_.health.gpu_memory_wait.count() == 0) return;
  auto ends_wait = [round](const Event& e) {
    return e.kind == Event::Kind::kSignal ||
           ((e.kind == Event::Kind::kRoundStopped || e.kind == Event::Kind::kWatcherError) &&
            e.round == round);
  };
  const GpuMemoryWait w = wait_for_gpu_memory(
      *nvml_, gpu_baseline_, config_.health.gpu_memory_wait,
      [&](std::chrono::milliseconds d) { return events_.wait_for(ends_wait, Clock::now() + d); });
  if (w.interrupted) {
    spdlog::info(
        "stopped waiting for the previous workers' GPU memory after {}: the round stopped, or a "
        "signal arrived",
        duration_text(w.waited));
  } else if (!w.still_held.empty()) {
    spdlog::warn(
        "the previous workers' GPU memory is still held after {} ({}); starting the new workers anyway",
        duration_text(w.waited), join(w.still_held, "; "));
  } else if (w.waited.count() > 0) {
    spdlog::info("waited {} for the previous workers' GPU memory to be released", duration_text(w.waited));
  }
}

// Joins the next round. No worker runs meanwhile: a signal ends the agent at once, the rendezvous left open.
rdzv::RendezvousInfo AgentLoop::rendezvous() {
  const int nproc = static_cast<int>(config_.workers.size());
  const auto start = Clock::now();
  rdzv::RendezvousInfo round;
  if (config_.prestart) {
    // The workers of the round to come, as far as they are known before it: their standbys only need the
    // interpreter and its environment (a release replaces the rest).
    std::vector<WorkerLogPaths> no_paths(static_cast<size_t>(nproc));
    for (int lr = 0; lr < nproc; ++lr) no_paths[static_cast<size_t>(lr)].local_rank = lr;
    processes_->prestart_missing(worker_launches(config_, rdzv::RendezvousInfo{}, no_paths, rdzv_->run_id()));
  }
  processes_->exit_on_signals(true);
  ready_ = false;
  observer_.set_group(nullptr);
  observer_.set_state("forming");
  await_healthy();
  try {
    round = rdzv_->next_rendezvous(nproc);
    processes_->exit_on_signals(false);
  } catch (const rdzv::SpareNotNeededError& e) {
    processes_->exit_on_signals(false);
    spdlog::info("{}", e.what());
    throw SpareUnused{};
  } catch (const rdzv::RendezvousError& e) {
    processes_->exit_on_signals(false);
    job_events_.duration("RENDEZVOUS", start);
    spdlog::error("rendezvous failed: {}", e.what());
    throw StepFailed{kExitRendezvousFailed, e.what()};
  }
  job_events_.duration("RENDEZVOUS", start);
  if (metrics_) metrics_->rendezvous_done(Clock::now() - start);
  lifecycle_.set_round(round.round);
  lifecycle_.record("round_formed",
                    {{"node_rank", round.group_rank},
                     {"nodes", round.group_world_size},
                     {"world_size", round.world_size},
                     {"ranks", {round.base_rank, round.rank_of(nproc - 1)}},
                     {"rendezvous_s", std::chrono::duration<double>(Clock::now() - start).count()},
                     {"dropped_nodes", round.dropped_nodes}});
  for (const std::string& node : round.dropped_nodes) lifecycle_.record("node_lost", {{"node", node}});
  if (std::string given = give_back_restart(job_, round, config_.supervision); !given.empty()) {
    spdlog::warn("{}", given);
  }
  spdlog::info("round {}: node {}/{}, ranks {}..{} of {}, store {}:{}", round.round, round.group_rank,
               round.group_world_size, round.base_rank, round.rank_of(nproc - 1), round.world_size,
               round.store_host, round.store_port);
  return round;
}

// The round's WorkerGroup: its log directories, every worker's launch (ranks, environment, files, stdin).
WorkerGroup AgentLoop::assign(const rdzv::RendezvousInfo& round) {
  std::vector<WorkerLogPaths> paths;
  try {
    paths = run_dir_->layout().create_attempt(round.round, static_cast<int>(config_.workers.size()));
  } catch (const std::filesystem::filesystem_error& e) {
    spdlog::error("cannot create the attempt's log directories: {}", e.what());
    throw StepFailed{kExitSpawnFailed, e.what()};
  }
  const auto start = Clock::now();
  WorkerGroup group = make_worker_group(config_, round, paths, rdzv_->run_id());
  job_events_.duration("ASSIGN_WORKER_RANKS", start);
  job_events_.enter_round(round);
  try {
    open_filtered_logs(config_, run_dir_->layout().attempt_dir(round.round), group);
  } catch (const std::filesystem::filesystem_error& e) {
    spdlog::error("cannot create the attempt's filtered logs: {}", e.what());
    throw StepFailed{kExitSpawnFailed, e.what()};
  }
  for (Worker& w : group.workers) w.launch.stdin_mode = worker_stdin(w.local_rank, foreground_terminal_);
  return group;
}

// Starts watching the round, then every worker; a worker that cannot start is the group's first event.
void AgentLoop::spawn(WorkerGroup& group) {
  round_end_.reset();
  watcher_.start(group.round.round);  // first: it heartbeats for this node while the GPUs are waited for
  if (generations_++ > 0) await_gpu_memory(group.round.round);
  observer_.set_group(&group);
  observer_.set_state("running");
  if (std::string error = processes_->spawn(group); !error.empty()) {
    dispatch(group, GroupEvent{.kind = GroupEvent::Kind::kSpawnFailed, .error = error});
  } else {
    ready_ = true;
  }
  observer_.set_group(&group);
}

// Supervises the group until supervise() finishes it: events from the other threads, the exit barrier's
// deadline, and with --hang_timeout the progress samples.
AgentLoop::RoundEnd AgentLoop::monitor(WorkerGroup& group) {
  ProgressSampler progress(config_.supervision.hang_timeout);
  std::optional<Clock::time_point> barrier;  // armed when the group enters the exit barrier
  while (!round_end_) {
    if (!group.in_exit_barrier) {
      barrier.reset();
    } else if (!barrier) {
      barrier = Clock::now() + config_.supervision.exit_barrier_timeout;
    }
    const auto sample = progress.next(group);
    auto deadline = barrier;
    for (const auto& due : {sample, observer_.next()}) {
      if (due && (!deadline || *due < *deadline)) deadline = due;
    }
    Event e;
    if (events_.pop(e, deadline)) {
      if (e.kind == Event::Kind::kWorkerExited) record_exit(group, e);
      if (auto ge = translate(group, e)) dispatch(group, std::move(*ge));
    } else if (barrier && Clock::now() >= *barrier) {
      dispatch(group, GroupEvent{.kind = GroupEvent::Kind::kBarrierTimeout});
    } else if (sample && Clock::now() >= *sample && progress.sample(group, processes_->timer_requests())) {
      lifecycle_.record(
          "hang", {{"seconds", std::chrono::duration<double>(config_.supervision.hang_timeout).count()}});
      dispatch(group, GroupEvent{.kind = GroupEvent::Kind::kHung});
    }
    if (auto due = observer_.next(); due && Clock::now() >= *due) observer_.tick();
  }
  watcher_.stop();
  ready_ = false;
  const std::string reason = round_end_reason(group);
  const std::string detail = group.stop ? group.stop->detail : "";
  lifecycle_.record("round_end", {{"reason", reason},
                                  {"by_node", group.stop ? json(group.stop->node_rank) : json()},
                                  {"detail", detail}});
  if (round_end_->outcome == Outcome::kRestart) {
    lifecycle_.record("restart", {{"restarts_used", job_.restarts_done},
                                  {"restarts_max", config_.supervision.max_restarts},
                                  {"reason", detail}});
  }
  if (metrics_) metrics_->round_ended(reason);
  observer_.set_group(&group);  // the metrics of the group as it ended
  return *round_end_;
}

std::string AgentLoop::round_end_reason(const WorkerGroup& group) const {
  if (round_end_->outcome == Outcome::kRestart) return "failure";
  if (round_end_->outcome == Outcome::kRejoin) return "membership";
  if (round_end_->outcome == Outcome::kSucceeded) return "done";
  return group.stop && group.stop->kind == rdzv::RoundStop::Kind::kShutdown ? "signal" : "exit";
}

void AgentLoop::record_exit(const WorkerGroup& group, const Event& e) {
  if (metrics_) metrics_->worker_exited(e.status);
  const Worker& w = group.workers.at(static_cast<size_t>(e.local_rank));
  lifecycle_.record("worker_exit",
                    {{"rank", w.rank},
                     {"local_rank", w.local_rank},
                     {"pid", e.pid},
                     {"exit_code", e.status.signal == 0 ? json(e.status.exit_code) : json()},
                     {"signal", e.status.signal != 0 ? json(signal_name(e.status.signal)) : json()}});
}

void AgentLoop::record_agent_exit(int exit_code, const std::string& detail) {
  lifecycle_.record("agent_exit", {{"exit_code", exit_code},
                                   {"state", exit_code == kExitSuccess ? "done" : "failed"},
                                   {"detail", detail}});
}

// The job's end on this node: its events, the rendezvous closed (unless a signal ended it: late agents may
// still join) and left, a temporary run directory removed on success.
int AgentLoop::finish(const WorkerGroup& group, const RoundEnd& end) {
  job_events_.job_end(group, end.outcome == Outcome::kSucceeded);
  record_agent_exit(end.exit_code, group.stop ? group.stop->detail : "");
  observer_.set_state(end.exit_code == kExitSuccess ? "done" : "failed",
                      end.exit_code == kExitSuccess ? "" : "exit code " + std::to_string(end.exit_code));
  observer_.flush(kFinalStatusWait);
  try {
    if (end.close_rendezvous) rdzv_->set_closed();
    rdzv_->shutdown();
  } catch (const rdzv::RendezvousError& e) {
    spdlog::debug("rendezvous shutdown: {}", e.what());
  }
  if (end.exit_code == kExitSuccess) run_dir_->remove_if_temporary();
  return end.exit_code;
}

}  // namespace ddprun::agent
