#include "agent/elastic_agent.h"

#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include <atomic>
#include <boost/asio.hpp>
#include <csignal>
#include <future>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>
#include <unistd.h>

#include "agent/event_queue.h"
#include "agent/failure_summary.h"
#include "agent/log_layout.h"
#include "agent/process_context.h"
#include "agent/worker_launches.h"
#include "rendezvous/store_error.h"

namespace ddprun::agent {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using rdzv::RoundStop;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
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
  }

  int run();

 private:
  struct Round {
    rdzv::RendezvousInfo info;
    std::vector<WorkerLogPaths> paths;
    std::vector<int> ranks;
  };
  // kRestart: a failure, counted against max_restarts. kRejoin: a membership change, not counted.
  enum class Outcome { kSucceeded, kRestart, kRejoin, kExit };

  template <typename F>
  auto on_io(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto fut = task.get_future();
    asio::post(io_, [&task] { task(); });
    return fut.get();
  }

  void start_io();
  void arm_signals();
  void start_watcher(int round);
  void stop_watcher();
  Outcome supervise(const Round& round, int& exit_code);
  WorkerFailure failure_of(const Round& round, const Event& e) const;
  void begin_stop(int sig);
  // The signal that made a node stop the round (kShutdown with exit code 128+N), or 0.
  static int shutdown_signal(const rdzv::RoundStop& stop) {
    bool by_signal = stop.kind == rdzv::RoundStop::Kind::kShutdown && stop.exit_code > 128 &&
                     stop.exit_code <= 128 + SIGRTMAX;
    return by_signal ? stop.exit_code - 128 : 0;
  }
  int signal_exit_code(int sig) const {
    auto it = config_.signal_exit_codes.find(sig);
    return it == config_.signal_exit_codes.end() ? 128 + sig : it->second;
  }

  AgentConfig config_;
  std::unique_ptr<rdzv::RendezvousHandler> rdzv_;
  asio::io_context io_;
  asio::signal_set signals_;
  std::unique_ptr<ProcessContext> procs_;
  std::thread io_thread_;
  EventQueue events_;
  std::thread watcher_;
  std::atomic<bool> watcher_stop_{false};
  std::atomic<bool> in_rendezvous_{false};
  std::optional<LogLayout> layout_;
  bool temp_log_dir_ = false;
  int restart_count_ = 0;
  bool ended_by_signal_ = false;  // a signal (here or on a peer) ended the job: leave the rendezvous open
};

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

WorkerFailure ElasticAgent::Loop::failure_of(const Round& round, const Event& e) const {
  const auto& paths = round.paths[static_cast<size_t>(e.local_rank)];
  WorkerFailure f{.time = e.time,
                  .host = hostname(),
                  .rank = round.ranks[static_cast<size_t>(e.local_rank)],
                  .local_rank = e.local_rank,
                  .exit_code = e.status.exit_code,
                  .signal = e.status.signal,
                  .pid = e.pid};
  if (auto ef = read_error_file(paths.error_file)) {
    f.error_file = paths.error_file.string();
    f.message = ef->message;
    f.traceback = ef->traceback;
    if (ef->timestamp) f.time = *ef->timestamp;
  } else {
    f.traceback = read_tail(paths.stderr_file, 20);
  }
  return f;
}

void ElasticAgent::Loop::begin_stop(int sig) {
  auto grace = config_.shutdown_grace;
  asio::post(io_, [this, sig, grace] {
    procs_->stop(sig, grace, [this] { events_.push(Event{.kind = Event::Kind::kGroupStopped}); });
  });
}

ElasticAgent::Loop::Outcome ElasticAgent::Loop::supervise(const Round& round, int& exit_code) {
  const int nproc = static_cast<int>(config_.workers.size());
  const int node = round.info.group_rank;
  int running = nproc;
  int succeeded = 0;
  bool stopping = false;
  bool store_lost = false;
  int signal = 0;
  std::optional<RoundStop> stop;
  std::vector<WorkerFailure> failures;
  std::optional<Clock::time_point> barrier_deadline;

  auto publish = [&](const RoundStop& s) {
    try {
      auto winner = rdzv_->stop_round(s);
      if (!stop) stop = winner;
    } catch (const rdzv::StoreError& e) {
      spdlog::error("cannot publish the end of round {} to the store: {}", round.info.round, e.what());
      if (!stop) stop = s;
      store_lost = true;
    }
  };

  while (true) {
    Event e;
    if (!events_.pop(e, barrier_deadline)) {
      spdlog::warn("exit barrier: the other nodes did not finish within {} s; exiting with success",
                   config_.exit_barrier_timeout.count() / 1000);
      stop = RoundStop{RoundStop::Kind::kDone, node, "exit barrier timed out", 0};
      barrier_deadline.reset();
      if (!stopping) {
        stopping = true;
        begin_stop(SIGTERM);
      }
      continue;
    }
    // The watcher of an earlier round may have reported after that round ended: not ours.
    if ((e.kind == Event::Kind::kRoundStopped || e.kind == Event::Kind::kWatcherError) &&
        e.round != round.info.round) {
      continue;
    }
    switch (e.kind) {
      case Event::Kind::kWorkerExited:
        --running;
        if (stopping) {
          // A worker of the group being stopped for a failure that failed by itself meanwhile (its @record
          // error file says so; the agent's SIGTERM writes none) is a failure too: the root cause is chosen
          // among them by timestamp (failure_summary.h), as torchrun does among the failures of one poll.
          if (!failures.empty() && !e.status.success()) {
            WorkerFailure f = failure_of(round, e);
            if (!f.error_file.empty()) failures.push_back(std::move(f));
          }
          break;
        }
        if (e.status.success()) {
          if (++succeeded == nproc) {
            spdlog::info("all {} local workers succeeded", nproc);
            try {
              rdzv_->node_done();
            } catch (const rdzv::StoreError& ex) {
              spdlog::warn("exit barrier: {}", ex.what());
              stop = RoundStop{RoundStop::Kind::kDone, node, "store gone after success", 0};
            }
            if (!stop) barrier_deadline = Clock::now() + config_.exit_barrier_timeout;
          }
          break;
        }
        failures.push_back(failure_of(round, e));
        spdlog::error("worker local_rank {} (rank {}, pid {}) failed: {}", e.local_rank, failures.back().rank,
                      e.pid, e.status.describe());
        if (auto dead = rdzv_->unresponsive_nodes(); !dead.empty()) {
          // The failure is the echo of a lost node: re-form without it, not counted as a restart.
          std::string which;
          for (int d : dead) which += (which.empty() ? "" : ", ") + std::to_string(d);
          publish(RoundStop{RoundStop::Kind::kMembership, node, "node(s) " + which + " lost", 0});
          failures.clear();
        } else {
          publish(RoundStop{RoundStop::Kind::kFailed, node,
                            "rank " + std::to_string(failures.back().rank) + " on " + hostname() + ": " +
                                e.status.describe(),
                            e.status.shell_code()});
        }
        stopping = true;
        begin_stop(SIGTERM);
        break;
      case Event::Kind::kRoundStopped:
        if (!stop) stop = e.stop;
        if (stop->kind != RoundStop::Kind::kDone && stop->node_rank != node) {
          spdlog::warn(
              "round {} ended by {}: {}", round.info.round,
              stop->node_rank >= 0 ? "node " + std::to_string(stop->node_rank) : std::string("a new node"),
              stop->detail);
        }
        barrier_deadline.reset();
        if (!stopping) {
          stopping = true;
          // A peer's signal reaches these workers too (SIGUSR1 must not become SIGTERM); else SIGTERM.
          const int sig = shutdown_signal(*stop);
          begin_stop(sig ? sig : SIGTERM);
        }
        break;
      case Event::Kind::kWatcherError:
        if (stop) break;  // the round already ended; the store host may have left
        spdlog::error("lost the rendezvous store: {}", e.error);
        store_lost = true;
        stop = RoundStop{RoundStop::Kind::kFailed, node, "store lost", kExitStoreFailed};
        barrier_deadline.reset();
        if (!stopping) {
          stopping = true;
          begin_stop(SIGTERM);
        }
        break;
      case Event::Kind::kSignal:
        // A peer stopped the round because it got this same signal: under Slurm every node gets it, a few ms
        // apart. Not a second signal: the workers keep their grace.
        if (signal == 0 && stop && stop->node_rank != node && shutdown_signal(*stop) == e.signal) {
          signal = e.signal;
          spdlog::warn("received {} (already forwarded: node {} got it first)", signal_name(signal),
                       stop->node_rank);
          break;
        }
        if (signal != 0 || (stopping && stop)) {
          spdlog::warn("received {} again: killing the workers now", signal_name(e.signal));
          asio::post(io_, [this] { procs_->signal_all(SIGKILL); });
          if (signal == 0) signal = e.signal;
          break;
        }
        signal = e.signal;
        spdlog::warn("received {}: forwarding it to the workers (grace {} s)", signal_name(signal),
                     config_.shutdown_grace.count() / 1000.0);
        publish(RoundStop{RoundStop::Kind::kShutdown, node,
                          "node " + std::to_string(node) + " got " + signal_name(signal), 128 + signal});
        barrier_deadline.reset();
        stopping = true;
        begin_stop(signal);
        break;
      case Event::Kind::kGroupStopped:
        stop_watcher();
        if (signal != 0) {
          exit_code = signal_exit_code(signal);
          ended_by_signal_ = true;
          return Outcome::kExit;
        }
        if (!failures.empty()) {
          std::fprintf(stderr, "%s", format_failure_summary(failures, config_.script_name).c_str());
        }
        if (store_lost) {
          exit_code = kExitStoreFailed;
          return Outcome::kExit;
        }
        if (!stop || stop->kind == RoundStop::Kind::kDone) {
          exit_code = kExitSuccess;
          return Outcome::kSucceeded;
        }
        if (stop->kind == RoundStop::Kind::kMembership) {
          spdlog::info("membership changed ({}): joining the next round", stop->detail);
          return Outcome::kRejoin;
        }
        if (stop->kind == RoundStop::Kind::kShutdown) {
          const int sig = shutdown_signal(*stop);
          exit_code = sig ? signal_exit_code(sig) : stop->exit_code;
          ended_by_signal_ = true;
          return Outcome::kExit;
        }
        if (failures.empty()) {
          exit_code = stop->exit_code;
        } else {
          // The first failure seen: the one that stopped the group, whose code the other nodes got too.
          const WorkerFailure& first = failures.front();
          exit_code = first.signal != 0 ? 128 + first.signal : first.exit_code;
        }
        if (exit_code == 0) exit_code = 1;
        if (stop->node_rank == node) rdzv_->note_local_failure();
        return restart_count_ < config_.max_restarts ? Outcome::kRestart : Outcome::kExit;
    }
  }
}

int ElasticAgent::Loop::run() {
  // A closed stdout (a pager that quit) must not kill the agent before it stops its workers.
  std::signal(SIGPIPE, SIG_IGN);
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
  } catch (const std::filesystem::filesystem_error& e) {
    spdlog::error("cannot create the log directory: {}; check --log_dir", e.what());
    return kExitSpawnFailed;
  }
  start_io();

  const int nproc = static_cast<int>(config_.workers.size());
  int exit_code = 0;
  while (true) {
    Round round;
    try {
      in_rendezvous_ = true;
      round.info = rdzv_->next_rendezvous(nproc);
      in_rendezvous_ = false;
    } catch (const rdzv::StoreError& e) {
      in_rendezvous_ = false;
      spdlog::error("rendezvous failed: {}", e.what());
      return kExitRendezvousFailed;
    }
    for (int lr = 0; lr < nproc; ++lr) round.ranks.push_back(round.info.base_rank + lr);
    spdlog::info("round {}: node {}/{}, ranks {}..{} of {}, store {}:{}", round.info.round,
                 round.info.group_rank, round.info.group_world_size, round.info.base_rank,
                 round.info.base_rank + nproc - 1, round.info.world_size, round.info.store_host,
                 round.info.store_port);
    try {
      round.paths = layout_->create_attempt(round.info.round, nproc);
    } catch (const std::filesystem::filesystem_error& e) {
      spdlog::error("cannot create the attempt's log directories: {}", e.what());
      return kExitSpawnFailed;
    }
    auto specs = worker_launches(config_, round.info, round.paths, round.ranks, rdzv_->run_id());
    start_watcher(round.info.round);
    std::string spawn_error = on_io([&]() -> std::string {
      try {
        for (const auto& w : specs) procs_->spawn(w);
      } catch (const std::exception& e) {
        return e.what();
      }
      return {};
    });
    if (!spawn_error.empty()) {
      spdlog::error("cannot start a worker: {}", spawn_error);
      try {
        rdzv_->stop_round(
            RoundStop{RoundStop::Kind::kShutdown, round.info.group_rank, spawn_error, kExitSpawnFailed});
      } catch (const rdzv::StoreError&) {
      }
      on_io([&] {
        procs_->stop(SIGKILL, std::chrono::milliseconds(0),
                     [this] { events_.push(Event{.kind = Event::Kind::kGroupStopped}); });
        return 0;
      });
      int ignored = 0;
      supervise(round, ignored);
      return kExitSpawnFailed;
    }
    Outcome outcome = supervise(round, exit_code);
    if (outcome == Outcome::kRejoin) continue;
    if (outcome == Outcome::kRestart) {
      ++restart_count_;
      spdlog::warn("restarting the worker group ({} of {} restarts)", restart_count_, config_.max_restarts);
      continue;
    }
    break;
  }
  try {
    if (!ended_by_signal_) rdzv_->set_closed();
    rdzv_->shutdown();
  } catch (const rdzv::StoreError& e) {
    spdlog::debug("rendezvous shutdown: {}", e.what());
  }
  if (temp_log_dir_ && exit_code == kExitSuccess) {
    std::error_code ignored;
    std::filesystem::remove_all(layout_->run_dir(), ignored);
  }
  return exit_code;
}

ElasticAgent::ElasticAgent(AgentConfig config, std::unique_ptr<rdzv::RendezvousHandler> rendezvous)
    : loop_(std::make_unique<Loop>(std::move(config), std::move(rendezvous))) {}

ElasticAgent::~ElasticAgent() = default;

int ElasticAgent::run() {
  try {
    return loop_->run();
  } catch (const std::exception& e) {
    // A store or file error that a step did not expect. The loop's destructor (with this agent's) stops and
    // reaps every worker; the job ends with ddprun's own failure code rather than std::terminate.
    spdlog::critical("internal error: {}; stopping the workers", e.what());
    return 1;
  }
}

}  // namespace ddprun::agent
