#include "agent/elastic_agent.h"

#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include <atomic>
#include <deque>
#include <fstream>
#include <boost/asio.hpp>
#include <csignal>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>
#include <unistd.h>

#include "agent/event_queue.h"
#include "agent/file_timer.h"
#include "agent/failure_summary.h"
#include "agent/log_layout.h"
#include "agent/prestart.h"
#include "agent/process_context.h"
#include "agent/progress_monitor.h"
#include "agent/stack_capture.h"
#include "agent/terminal.h"
#include "agent/worker_group.h"
#include "agent/worker_launches.h"
#include "rendezvous/text_util.h"

namespace ddprun::agent {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

class ElasticAgent::Loop {
 public:
  Loop(AgentConfig config, std::unique_ptr<rdzv::RendezvousHandler> rendezvous)
      : config_(std::move(config)), rdzv_(std::move(rendezvous)), signals_(io_) {}

  ~Loop() {
    stop_watcher();
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
    procs_.reset();  // io is not running: kills and reaps anything left
    timer_server_.reset();
  }

  int run();

 private:
  // How one round ended (from supervise()'s kFinish action).
  struct RoundEnd {
    Outcome outcome = Outcome::kExit;
    int exit_code = 0;
    bool close_rendezvous = true;
  };

  template <typename F>
  auto on_io(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto fut = task.get_future();
    asio::post(io_, [&task] { task(); });
    return fut.get();
  }

  bool open_log_dir();
  std::filesystem::path prestart_stub_path() const {
    return LogLayout::python_hook_dir(layout_->run_dir()) / "ddprun_prestart.py";
  }
  bool start_watchdogs();
  void start_io();
  void arm_signals();
  void start_watcher(int round);
  void stop_watcher();
  RoundEnd run_round(WorkerGroup& group);
  std::string spawn(WorkerGroup& group);
  void schedule_standbys(const WorkerGroup& group);
  void sample_progress(const WorkerGroup& group, ProgressTracker& tracker);
  std::optional<GroupEvent> translate(const WorkerGroup& group, const Event& e) const;
  void dispatch(WorkerGroup& group, GroupEvent event);
  void execute(WorkerGroup& group, const Action& a, std::deque<GroupEvent>& results);
  WorkerFailure failure_of(const Worker& w, const Event& e) const;
  void stop_workers(int sig, std::chrono::milliseconds grace);
  // --event-log-handler (agent/event_log.h): torch's events, printed on stderr when on.
  void record_event(const StatusEvent& e) const;
  void record_duration(const std::string& state, Clock::time_point since);
  int record_agent_failed(int exit_code, const std::string& error);
  void record_job_end(const WorkerGroup& group, const RoundEnd& end);
  int signal_exit_code(int sig) const {
    auto it = config_.signal_exit_codes.find(sig);
    return it == config_.signal_exit_codes.end() ? 128 + sig : it->second;
  }

  AgentConfig config_;
  std::unique_ptr<rdzv::RendezvousHandler> rdzv_;
  asio::io_context io_;
  asio::signal_set signals_;
  std::unique_ptr<ProcessContext> procs_;
  asio::steady_timer prestart_timer_{io_};  // --prestart: when the next standbys start (io's thread)
  std::unique_ptr<FileTimerServer> timer_server_;  // torch's FileTimer (on io_), when enabled
  std::thread io_thread_;
  EventQueue events_;
  std::thread watcher_;
  std::atomic<bool> watcher_stop_{false};
  std::atomic<bool> in_rendezvous_{false};
  std::optional<LogLayout> layout_;
  bool temp_log_dir_ = false;
  SupervisionPolicy policy_;
  std::optional<RoundEnd> round_end_;  // set by the kFinish action of the current round
  bool foreground_terminal_ = false;   // stdin is a terminal with the agent in its foreground (terminal.h)
  StragglerTracker stragglers_;         // loop thread only
  bool print_events_ = false;           // loop thread only, like the two below
  StatusEvent event_;                   // the agent's fields of the next event (group: the last round's)
  Clock::time_point run_start_;
};

bool ElasticAgent::Loop::open_log_dir() {
  try {
    if (config_.log_dir.empty()) {
      std::string tmpl =
          (std::filesystem::temp_directory_path() / ("ddprun-" + rdzv_->run_id() + "-XXXXXX")).string();
      if (!mkdtemp(tmpl.data()))
        throw std::filesystem::filesystem_error("cannot create a temporary log directory", tmpl,
                                                std::error_code(errno, std::generic_category()));
      layout_.emplace(tmpl);
      temp_log_dir_ = true;
    } else {
      layout_.emplace(LogLayout::create(config_.log_dir, rdzv_->run_id()));
      spdlog::info("worker logs in {}", layout_->run_dir().string());
    }
    return true;
  } catch (const std::filesystem::filesystem_error& e) {
    spdlog::error("cannot create the log directory: {}; check --log_dir", e.what());
    return false;
  }
}

// The stack-dump hook for Python workers and torch's FileTimer server, when enabled (before io runs).
bool ElasticAgent::Loop::start_watchdogs() {
  const auto& run_dir = layout_->run_dir();
  try {
    if (stack_capture_enabled(config_)) {
      std::filesystem::create_directories(LogLayout::python_hook_dir(run_dir));
      std::ofstream hook(LogLayout::python_hook_dir(run_dir) / "sitecustomize.py");
      hook << python_stack_hook();
      if (!hook.flush()) throw std::runtime_error("cannot write " + LogLayout::python_hook_dir(run_dir).string());
    }
    if (config_.prestart) {
      std::filesystem::create_directories(LogLayout::python_hook_dir(run_dir));
      std::ofstream stub(prestart_stub_path());
      stub << prestart_stub_source();
      if (!stub.flush()) throw std::runtime_error("cannot write " + prestart_stub_path().string());
    }
    if (file_timer_enabled(config_)) {
      timer_server_ = std::make_unique<FileTimerServer>(io_, timer_file(config_, run_dir), [this](const TimerRequest& r) {
        events_.push(Event{.kind = Event::Kind::kDeadlineMissed, .pid = r.pid, .error = r.scope_id, .signal = r.signal});
      });
      spdlog::info("serving torch's FileTimer at {}", timer_server_->path().string());
    }
  } catch (const std::exception& e) {
    spdlog::error("cannot set up the workers' watchdog: {}", e.what());
    return false;
  }
  return true;
}

void ElasticAgent::Loop::start_io() {
  procs_ = std::make_unique<ProcessContext>(io_, [this](int local_rank, pid_t pid, ExitStatus status) {
    events_.push(Event{.kind = Event::Kind::kWorkerExited,
                       .local_rank = local_rank,
                       .pid = pid,
                       .status = status,
                       .time = unix_now()});
  });
  for (int sig : config_.signals_to_handle) signals_.add(sig);
  arm_signals();
  io_thread_ = std::thread([this] {
    auto guard = asio::make_work_guard(io_);
    io_.run();
  });
}

void ElasticAgent::Loop::arm_signals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (in_rendezvous_) {
      // No worker runs while the agent waits in the rendezvous: leave at once, the rendezvous stays open.
      spdlog::warn("received {} while waiting in the rendezvous; exiting", signal_name(sig));
      std::_Exit(signal_exit_code(sig));
    }
    events_.push(Event{.kind = Event::Kind::kSignal, .signal = sig});
    arm_signals();
  });
}

void ElasticAgent::Loop::start_watcher(int round) {
  watcher_stop_ = false;
  watcher_ = std::thread([this, round] {
    while (!watcher_stop_) {
      try {
        if (auto stop = rdzv_->wait_round_stopped(std::chrono::milliseconds(1000))) {
          events_.push(Event{.kind = Event::Kind::kRoundStopped, .stop = *stop, .round = round});
          return;
        }
      } catch (const std::exception& e) {
        events_.push(Event{.kind = Event::Kind::kWatcherError, .error = e.what(), .round = round});
        return;
      }
    }
  });
}

void ElasticAgent::Loop::stop_watcher() {
  watcher_stop_ = true;
  if (watcher_.joinable()) watcher_.join();
}

WorkerFailure ElasticAgent::Loop::failure_of(const Worker& w, const Event& e) const {
  WorkerFailure f{.time = e.time,
                  .host = policy_.host,
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
  return f;
}

void ElasticAgent::Loop::stop_workers(int sig, std::chrono::milliseconds grace) {
  asio::post(io_, [this, sig, grace] {
    procs_->stop(sig, grace, [this] { events_.push(Event{.kind = Event::Kind::kGroupStopped}); });
  });
}

// What the loop's other threads reported, as an event of the group; nullopt for a watcher's report about an
// earlier round (it may arrive after that round ended).
std::optional<GroupEvent> ElasticAgent::Loop::translate(const WorkerGroup& group, const Event& e) const {
  using K = GroupEvent::Kind;
  switch (e.kind) {
    case Event::Kind::kWorkerExited: {
      GroupEvent g{.kind = K::kWorkerExited, .local_rank = e.local_rank, .status = e.status};
      if (!e.status.success()) g.failure = failure_of(group.workers.at(static_cast<size_t>(e.local_rank)), e);
      return g;
    }
    case Event::Kind::kGroupStopped:
      return GroupEvent{.kind = K::kGroupStopped};
    case Event::Kind::kSignal:
      return GroupEvent{.kind = K::kSignal, .signal = e.signal};
    case Event::Kind::kRoundStopped:
      if (e.round != group.round.round) return std::nullopt;
      return GroupEvent{.kind = K::kRoundStopped, .stop = e.stop};
    case Event::Kind::kWatcherError:
      if (e.round != group.round.round) return std::nullopt;
      return GroupEvent{.kind = K::kStoreLost, .error = e.error};
    case Event::Kind::kDeadlineMissed: {
      GroupEvent g{.kind = K::kDeadlineMissed, .local_rank = -1, .signal = e.signal, .pid = e.pid, .scope = e.error};
      for (const Worker& w : group.workers) {
        if (w.pid == e.pid) g.local_rank = w.local_rank;
      }
      return g;
    }
  }
  return std::nullopt;
}

// Runs the transition function on `event` and performs its actions; the results of actions (a store reply, a
// probe) are events too, handled in order before the loop waits again.
void ElasticAgent::Loop::dispatch(WorkerGroup& group, GroupEvent event) {
  std::deque<GroupEvent> pending{std::move(event)};
  while (!pending.empty()) {
    GroupEvent e = std::move(pending.front());
    pending.pop_front();
    for (const Action& a : supervise(group, e, policy_)) execute(group, a, pending);
  }
}

void ElasticAgent::Loop::execute(WorkerGroup& group, const Action& a, std::deque<GroupEvent>& results) {
  using K = GroupEvent::Kind;
  // Rendezvous failures (RendezvousError: the handler translates the store's) become events; anything else
  // is a bug and propagates to run()'s catch-all.
  switch (a.kind) {
    case Action::Kind::kLog:
      spdlog::log(a.level == Action::Level::kError  ? spdlog::level::err
                  : a.level == Action::Level::kWarn ? spdlog::level::warn
                                                    : spdlog::level::info,
                  "{}", a.text);
      break;
    case Action::Kind::kStopWorkers:
      stop_workers(a.signal, a.grace);
      break;
    case Action::Kind::kKillWorkers:
      asio::post(io_, [this] { procs_->signal_all(SIGKILL); });
      break;
    case Action::Kind::kProbeLiveness: {
      GroupEvent probed{.kind = K::kLivenessProbed};
      try {
        probed.dead_nodes = rdzv_->unresponsive_nodes();
      } catch (const rdzv::RendezvousError& e) {
        spdlog::warn("cannot tell which nodes are alive: {}", e.what());
      }
      results.push_back(std::move(probed));
      break;
    }
    case Action::Kind::kPublishStop:
      try {
        results.push_back(GroupEvent{.kind = K::kStopPublished, .stop = rdzv_->stop_round(a.stop)});
      } catch (const rdzv::RendezvousError& e) {
        results.push_back(GroupEvent{.kind = K::kPublishFailed, .stop = a.stop, .error = e.what()});
      }
      break;
    case Action::Kind::kMarkNodeDone:
      try {
        rdzv_->node_done();
      } catch (const rdzv::RendezvousError& e) {
        results.push_back(GroupEvent{.kind = K::kNodeDoneFailed, .error = e.what()});
      }
      break;
    case Action::Kind::kPrintSummary:
      std::fprintf(stderr, "%s", format_failure_summary(group.failures, config_.script_name).c_str());
      break;
    case Action::Kind::kNoteLocalFailure:
      try {
        rdzv_->note_local_failure();
      } catch (const rdzv::RendezvousError& e) {
        spdlog::warn("cannot record this node's failure in the store: {}", e.what());
      }
      break;
    case Action::Kind::kFinish:
      round_end_ = RoundEnd{a.outcome, a.exit_code, a.close_rendezvous};
      break;
    case Action::Kind::kCaptureStacks: {
      std::vector<StackTarget> targets;
      for (const Worker& w : group.workers) {
        if (w.state != WorkerState::kHealthy || w.pid <= 0) continue;
        auto pipe = w.launch.env.find("TORCH_NCCL_DEBUG_INFO_PIPE_FILE");
        targets.push_back({w.rank, w.pid, w.paths.stderr_file,
                           pipe == w.launch.env.end() ? "" : pipe->second + std::to_string(w.rank) + ".pipe"});
      }
      results.push_back(GroupEvent{.kind = K::kStacksCaptured,
                                   .stacks = capture_stacks(targets, stack_dump_signal()),
                                   .time = unix_now()});
      break;
    }
    case Action::Kind::kSignalProcess:
      if (::kill(a.pid, a.signal) != 0 && errno != ESRCH) {
        spdlog::error("cannot send {} to pid {}: {}", signal_name(a.signal), a.pid, std::strerror(errno));
      }
      break;
  }
}

// Spawns every worker of the group (on io's thread, see ProcessContext); "" or the error that stopped it.
// With --prestart, then starts the standbys for the next round (a failure there only costs their speed-up).
std::string ElasticAgent::Loop::spawn(WorkerGroup& group) {
  return on_io([&]() -> std::string {
    try {
      for (Worker& w : group.workers) w.pid = procs_->spawn(w.launch);
    } catch (const std::exception& e) {
      return e.what();
    }
    if (config_.prestart) schedule_standbys(group);
    return {};
  });
}

// On io's thread: starts the standbys for the next round config_.prestart_delay from now (their imports do
// not compete with the start-up of the workers just spawned). A later call replaces a pending one.
void ElasticAgent::Loop::schedule_standbys(const WorkerGroup& group) {
  std::vector<std::pair<WorkerLaunch, size_t>> models;
  for (const Worker& w : group.workers) {
    const size_t interpreter_args = config_.workers[static_cast<size_t>(w.local_rank)].interpreter_args;
    if (interpreter_args > 0) models.emplace_back(w.launch, interpreter_args);
  }
  prestart_timer_.expires_after(config_.prestart_delay);
  prestart_timer_.async_wait([this, models = std::move(models)](const boost::system::error_code& ec) {
    if (ec) return;
    for (const auto& [launch, interpreter_args] : models) {
      try {
        procs_->prestart(launch, interpreter_args, prestart_stub_path());
      } catch (const std::exception& e) {
        spdlog::warn("{}; local_rank {} will start afresh after a restart", e.what(), launch.local_rank);
      }
    }
  });
}

// One sample of every running worker for hang detection; FileTimer requests count for every rank.
void ElasticAgent::Loop::sample_progress(const WorkerGroup& group, ProgressTracker& tracker) {
  std::vector<pid_t> pgids;
  for (const Worker& w : group.workers) {
    if (w.state == WorkerState::kHealthy && w.pid > 0) pgids.push_back(w.pid);  // pid == its group id
  }
  const auto cpu = process_group_cpu_seconds(pgids);
  const uint64_t timer_requests = timer_server_ ? timer_server_->requests() : 0;
  std::map<int, ProgressSample> samples;
  std::map<int, double> step_seconds;
  for (const Worker& w : group.workers) {
    if (w.state != WorkerState::kHealthy || w.pid <= 0) continue;
    if (auto beat = read_heartbeat(w.paths.progress_file)) step_seconds[w.rank] = beat->second;
    auto c = cpu.find(w.pid);
    samples[w.local_rank] = ProgressSample{
        .cpu_seconds = c == cpu.end() ? 0.0 : c->second,
        .output_bytes = total_file_bytes({w.launch.stdout_file, w.launch.stderr_file}),
        .heartbeats = modification_ns(w.paths.progress_file) + timer_requests};
  }
  tracker.observe(Clock::now(), samples);
  for (const auto& [rank, median] : stragglers_.observe(step_seconds)) {
    spdlog::warn("rank {} is a straggler: its steps take {:.3f} s, {:.1f}x the local ranks' median of {:.3f} s",
                 rank, step_seconds[rank], step_seconds[rank] / median, median);
  }
}

ElasticAgent::Loop::RoundEnd ElasticAgent::Loop::run_round(WorkerGroup& group) {
  round_end_.reset();
  start_watcher(group.round.round);
  if (std::string error = spawn(group); !error.empty()) {
    dispatch(group, GroupEvent{.kind = GroupEvent::Kind::kSpawnFailed, .error = error});
  }
  std::optional<Clock::time_point> barrier_deadline;
  // Hang detection: sample every progress_interval while the group is healthy.
  const bool watch_progress = config_.hang_timeout.count() > 0;
  ProgressTracker tracker(config_.hang_timeout, Clock::now());
  std::optional<Clock::time_point> next_sample;
  if (watch_progress) next_sample = Clock::now();
  while (!round_end_) {
    if (!group.in_exit_barrier) {
      barrier_deadline.reset();
    } else if (!barrier_deadline) {
      barrier_deadline = Clock::now() + config_.exit_barrier_timeout;
    }
    if (group.state != GroupState::kHealthy) next_sample.reset();
    auto deadline = barrier_deadline;
    if (next_sample && (!deadline || *next_sample < *deadline)) deadline = next_sample;
    Event e;
    if (events_.pop(e, deadline)) {
      if (auto ge = translate(group, e)) dispatch(group, std::move(*ge));
    } else if (barrier_deadline && Clock::now() >= *barrier_deadline) {
      dispatch(group, GroupEvent{.kind = GroupEvent::Kind::kBarrierTimeout});
    } else if (next_sample && Clock::now() >= *next_sample) {
      sample_progress(group, tracker);
      next_sample = Clock::now() + progress_interval(config_.hang_timeout);
      if (tracker.hung(Clock::now())) dispatch(group, GroupEvent{.kind = GroupEvent::Kind::kHung});
    }
  }
  stop_watcher();
  return *round_end_;
}

void ElasticAgent::Loop::record_event(const StatusEvent& e) const {
  if (!print_events_) return;
  const std::string line = status_event_json(e) + "\n";
  if (::write(STDERR_FILENO, line.data(), line.size()) < 0) spdlog::debug("cannot print an event: {}", strerror(errno));
}

// torch's record_duration(state): an AGENT event with how long the step took, and the last round's group.
void ElasticAgent::Loop::record_duration(const std::string& state, Clock::time_point since) {
  event_.state = state;
  event_.agent_restarts = policy_.restarts_done;
  event_.duration_ms = std::chrono::duration<double, std::milli>(Clock::now() - since).count();
  record_event(event_);
  event_.duration_ms.reset();
}

// torch's agent FAILED event (an exception ended its run); returns exit_code.
int ElasticAgent::Loop::record_agent_failed(int exit_code, const std::string& error) {
  event_.state = "FAILED";
  event_.agent_restarts = policy_.restarts_done;
  event_.total_run_time = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - run_start_).count();
  event_.raw_error = error;
  record_event(event_);
  return exit_code;
}

// The end of the job: a WORKER event per worker and the agent's SUCCEEDED, or (a signal, the store lost, a
// spawn failure: an exception in torch's agent) the agent's FAILED only.
void ElasticAgent::Loop::record_job_end(const WorkerGroup& group, const RoundEnd& end) {
  if (group.signal != 0) {
    record_agent_failed(0, "SignalException: Process " + std::to_string(::getpid()) + " got signal: " +
                               std::to_string(group.signal));
    return;
  }
  if (group.store_lost || group.spawn_failed) {
    record_agent_failed(0, group.store_lost ? "the rendezvous store was lost" : "a worker could not be started");
    return;
  }
  event_.agent_restarts = policy_.restarts_done;
  event_.total_run_time = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - run_start_).count();
  for (const StatusEvent& e : worker_status_events(group, end.outcome == Outcome::kSucceeded, event_)) record_event(e);
  event_.state = "SUCCEEDED";  // the agent ran to the end, whatever its workers did
  record_event(event_);
}

int ElasticAgent::Loop::run() {
  // A closed stdout (a pager that quit) must not kill the agent before it stops its workers.
  std::signal(SIGPIPE, SIG_IGN);
  run_start_ = Clock::now();
  print_events_ = events_printed(config_.event_log_handler, std::getenv("LOGLEVEL"));
  if (print_events_) {
    event_ = StatusEvent{.run_id = rdzv_->run_id(),
                         .role = config_.role,
                         .hostname = fq_hostname(),
                         .rdzv_backend = config_.rdzv_backend,
                         .entry_point = config_.entry_point};
  }
  if (!open_log_dir() || !start_watchdogs()) return record_agent_failed(kExitSpawnFailed, "cannot set up the log directory");
  start_io();
  policy_ = SupervisionPolicy{.max_restarts = config_.max_restarts,
                              .signal_exit_codes = config_.signal_exit_codes,
                              .shutdown_grace = config_.shutdown_grace,
                              .exit_barrier_timeout = config_.exit_barrier_timeout,
                              .hang_timeout = config_.hang_timeout,
                              .host = local_hostname()};

  const int nproc = static_cast<int>(config_.workers.size());
  foreground_terminal_ = stdin_is_foreground_terminal();
  RoundEnd end;
  while (true) {
    rdzv::RendezvousInfo info;
    const auto rendezvous_start = Clock::now();
    try {
      in_rendezvous_ = true;
      info = rdzv_->next_rendezvous(nproc);
      in_rendezvous_ = false;
    } catch (const rdzv::RendezvousError& e) {
      in_rendezvous_ = false;
      record_duration("RENDEZVOUS", rendezvous_start);
      spdlog::error("rendezvous failed: {}", e.what());
      return record_agent_failed(kExitRendezvousFailed, e.what());
    }
    record_duration("RENDEZVOUS", rendezvous_start);
    spdlog::info("round {}: node {}/{}, ranks {}..{} of {}, store {}:{}", info.round, info.group_rank,
                 info.group_world_size, info.base_rank, info.base_rank + nproc - 1, info.world_size,
                 info.store_host, info.store_port);
    std::vector<WorkerLogPaths> paths;
    try {
      paths = layout_->create_attempt(info.round, nproc);
    } catch (const std::filesystem::filesystem_error& e) {
      spdlog::error("cannot create the attempt's log directories: {}", e.what());
      return record_agent_failed(kExitSpawnFailed, e.what());
    }
    const auto assign_start = Clock::now();
    WorkerGroup group = make_worker_group(config_, info, paths, rdzv_->run_id());
    record_duration("ASSIGN_WORKER_RANKS", assign_start);
    event_.group_rank = info.group_rank;
    event_.group_world_size = info.group_world_size;
    try {
      open_filtered_logs(config_, layout_->attempt_dir(info.round), group);
    } catch (const std::filesystem::filesystem_error& e) {
      spdlog::error("cannot create the attempt's filtered logs: {}", e.what());
      return record_agent_failed(kExitSpawnFailed, e.what());
    }
    for (Worker& w : group.workers) w.launch.stdin_mode = worker_stdin(w.local_rank, foreground_terminal_);
    end = run_round(group);
    if (end.outcome == Outcome::kRejoin) continue;
    if (end.outcome == Outcome::kRestart) {
      ++policy_.restarts_done;
      spdlog::warn("restarting the worker group ({} of {} restarts)", policy_.restarts_done,
                   config_.max_restarts);
      continue;
    }
    record_job_end(group, end);
    break;
  }
  try {
    if (end.close_rendezvous) rdzv_->set_closed();
    rdzv_->shutdown();
  } catch (const rdzv::RendezvousError& e) {
    spdlog::debug("rendezvous shutdown: {}", e.what());
  }
  if (temp_log_dir_ && end.exit_code == kExitSuccess) {
    std::error_code ignored;
    std::filesystem::remove_all(layout_->run_dir(), ignored);
  }
  return end.exit_code;
}

ElasticAgent::ElasticAgent(AgentConfig config, std::unique_ptr<rdzv::RendezvousHandler> rendezvous)
    : loop_(std::make_unique<Loop>(std::move(config), std::move(rendezvous))) {}

ElasticAgent::~ElasticAgent() = default;

int ElasticAgent::run() {
  try {
    return loop_->run();
  } catch (const std::exception& e) {
    // A bug: an error no step expected. Destroying the loop kills and reaps every worker; the job ends with
    // ddprun's own failure code rather than std::terminate.
    spdlog::critical("internal error: {}; stopping the workers", e.what());
    loop_.reset();
    return kExitInternal;
  }
}

}  // namespace ddprun::agent
