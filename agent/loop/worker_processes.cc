#include "agent/loop/worker_processes.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <csignal>
#include <cstdlib>
#include <future>
#include <vector>

#include "agent/process/worker_launch.h"

namespace ddprun::agent {

namespace asio = boost::asio;

namespace {

// Runs f on io's thread and waits for its result.
template <typename F>
auto on_io(asio::io_context& io, F f) -> decltype(f()) {
  std::packaged_task<decltype(f())()> task(std::move(f));
  auto result = task.get_future();
  asio::post(io, [&task] { task(); });
  return result.get();
}

}  // namespace

WorkerProcesses::WorkerProcesses(const AgentConfig& config, EventQueue& events,
                                 std::filesystem::path prestart_stub)
    : config_(config), events_(events), prestart_stub_(std::move(prestart_stub)) {}

WorkerProcesses::~WorkerProcesses() {
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
  procs_.reset();  // io is not running: kills and reaps anything left
  timer_server_.reset();
}

void WorkerProcesses::serve_file_timer(const std::filesystem::path& fifo) {
  timer_server_ = std::make_unique<FileTimerServer>(io_, fifo, [this](const TimerRequest& r) {
    events_.push(
        Event{.kind = Event::Kind::kDeadlineMissed, .pid = r.pid, .error = r.scope_id, .signal = r.signal});
  });
  spdlog::info("serving torch's FileTimer at {}", timer_server_->path().string());
}

void WorkerProcesses::start() {
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

void WorkerProcesses::arm_signals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (exit_on_signals_) {
      spdlog::warn("received {} while waiting in the rendezvous; exiting", signal_name(sig));
      std::_Exit(config_.supervision.exit_code_of_signal(sig));
    }
    events_.push(Event{.kind = Event::Kind::kSignal, .signal = sig});
    arm_signals();
  });
}

std::string WorkerProcesses::spawn(WorkerGroup& group) {
  return on_io(io_, [&]() -> std::string {
    try {
      for (Worker& w : group.workers) w.pid = procs_->spawn(w.launch);
    } catch (const std::exception& e) {
      return e.what();
    }
    if (config_.prestart) schedule_standbys(group);
    return {};
  });
}

// On io's thread. A later call replaces a pending one.
void WorkerProcesses::schedule_standbys(const WorkerGroup& group) {
  std::vector<std::pair<WorkerLaunch, size_t>> models;
  for (const Worker& w : group.workers) {
    const size_t interpreter_args = config_.workers[static_cast<size_t>(w.local_rank)].interpreter_args;
    if (interpreter_args > 0) models.emplace_back(w.launch, interpreter_args);
  }
  // prestart_delay later: their imports do not compete with the start-up of the workers just spawned.
  prestart_timer_.expires_after(config_.prestart_delay);
  prestart_timer_.async_wait([this, models = std::move(models)](const boost::system::error_code& ec) {
    if (ec) return;
    for (const auto& [launch, interpreter_args] : models) {
      try {
        procs_->prestart(launch, interpreter_args, prestart_stub_);
      } catch (const std::exception& e) {
        spdlog::warn("{}; local_rank {} will start afresh after a restart", e.what(), launch.local_rank);
      }
    }
  });
}

void WorkerProcesses::prestart_missing(const std::vector<WorkerLaunch>& launches) {
  on_io(io_, [&] {
    const std::vector<int> have = procs_->standbys();
    for (const WorkerLaunch& launch : launches) {
      const size_t interpreter_args =
          config_.workers[static_cast<size_t>(launch.local_rank)].interpreter_args;
      if (interpreter_args == 0 || std::find(have.begin(), have.end(), launch.local_rank) != have.end())
        continue;
      try {
        procs_->prestart(launch, interpreter_args, prestart_stub_);
      } catch (const std::exception& e) {
        spdlog::warn("{}; local_rank {} will start afresh", e.what(), launch.local_rank);
      }
    }
  });
}

void WorkerProcesses::stop(int sig, std::chrono::milliseconds grace) {
  asio::post(io_, [this, sig, grace] {
    procs_->stop(sig, grace, [this] { events_.push(Event{.kind = Event::Kind::kGroupStopped}); });
  });
}

void WorkerProcesses::kill() {
  asio::post(io_, [this] { procs_->signal_all(SIGKILL); });
}

}  // namespace ddprun::agent
