#include "agent/process/process_context.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "agent/process/orphan_guard.h"
#include "agent/process/output_pump.h"
#include "agent/process/prestart.h"
#include "agent/process/spawn.h"
#include "agent/process/terminal.h"
#include "agent/process/worker_streams.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

namespace asio = boost::asio;

namespace {

// asio installs its handlers without SA_RESTART: add it, so that a SIGCHLD does not interrupt a read or a
// write somewhere in the agent.
void restart_interrupted_calls(int sig) {
  struct sigaction action {};
  if (::sigaction(sig, nullptr, &action) != 0 || (action.sa_flags & SA_RESTART)) return;
  action.sa_flags |= SA_RESTART;
  ::sigaction(sig, &action, nullptr);
}

void wait_reaped(pid_t pid) {
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

class ProcessContext::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, ExitFn on_exit)
      : io_(io), on_exit_(std::move(on_exit)), grace_timer_(io), sigchld_(io, SIGCHLD) {
    restart_interrupted_calls(SIGCHLD);
  }
  // After construction (it needs weak_from_this()).
  void start() { watch_stops(); }

  pid_t spawn(const WorkerLaunch& w);
  void prestart(const WorkerLaunch& like, size_t interpreter_args, const std::filesystem::path& stub);
  std::vector<int> standbys() const;
  void signal_all(int sig);
  void stop(int sig, std::chrono::milliseconds grace, std::function<void()> done);
  size_t running() const { return running_; }
  std::vector<pid_t> pids() const;
  void close();

 private:
  // A spawned worker's process, from its spawn until it is reaped.
  struct Child {
    int local_rank = 0;
    pid_t pid = -1;
    WorkerLaunch::Stdin stdin_mode = WorkerLaunch::Stdin::kInherit;
    std::unique_ptr<asio::posix::stream_descriptor> pidfd;  // until the exit is seen
    bool stopped = false;                                   // by a signal, until it continues
    bool exited = false;
    bool reaped = false;  // by someone else: the status was lost
    std::vector<std::shared_ptr<OutputPump>> pumps;
  };
  struct StandbyEntry {
    Standby standby;
    std::unique_ptr<asio::posix::stream_descriptor> watch;  // its pidfd
  };
  std::optional<SpawnedProcess> release_standby(const WorkerLaunch& w, int out_fd, int err_fd);
  void on_standby_exited(int local_rank, pid_t pid);
  void end_standby(StandbyEntry& entry);
  void watch(const std::shared_ptr<Child>& worker);
  void on_exited(const std::shared_ptr<Child>& worker);
  void watch_stops();
  void on_stopped_or_continued(Child& worker);
  void arm_grace_timer();
  void on_grace_expired();
  void maybe_finish_stop();
  void reap_exited();

  asio::io_context& io_;
  ExitFn on_exit_;
  std::map<pid_t, std::shared_ptr<Child>> workers_;        // running, and exited but not reaped yet
  std::vector<std::shared_ptr<OutputPump>> draining_;      // pumps of reaped workers, until end of file
  std::map<int, std::unique_ptr<StandbyEntry>> standbys_;  // by local rank
  size_t running_ = 0;
  bool closed_ = false;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point deadline_;
  asio::steady_timer grace_timer_;
  std::vector<std::function<void()>> done_;
  asio::signal_set sigchld_;
  TerminalForeground terminal_;  // given to the kTerminal worker while it runs and is not stopped
  OrphanGuard guard_;            // kills the workers' groups if this process dies without close()
};

pid_t ProcessContext::Impl::spawn(const WorkerLaunch& w) {
  const std::string who = "cannot start local_rank " + std::to_string(w.local_rank);
  if (closed_) throw std::logic_error(who + ": the process context is closed");
  if (stopping_) throw std::logic_error(who + ": a stop() is in progress");
  if (w.argv.empty()) throw std::invalid_argument(who + ": empty argv");
  const std::string exe = find_program(w.argv[0], w.env, who);
  // A duplicate filter needs the stream's lines: through a pipe, like whole_lines.
  StreamSetup out = setup_stream(w.stdout_file, w.console_stdout, w.stdout_prefix,
                                 w.whole_lines || w.stdout_duplicate.active(), who);
  StreamSetup err = setup_stream(w.stderr_file, w.console_stderr, w.stderr_prefix,
                                 w.whole_lines || w.stderr_duplicate.active(), who);
  const UniqueFd in = open_stdin(w.stdin_mode, who);

  std::optional<SpawnedProcess> child = release_standby(w, out.child_fd.get(), err.child_fd.get());
  if (!child) {
    ExecStrings strings(w.argv, w.env);
    cpu_set_t affinity;
    try {
      affinity = cpu_set_of(w.cpu_affinity);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(who + ": " + e.what());
    }
    SpawnRequest request;
    request.path = exe.c_str();
    request.argv = strings.argv();
    request.envp = strings.envp();
    request.stdin_fd = in.get();
    request.take_terminal = w.stdin_mode == WorkerLaunch::Stdin::kTerminal;
    request.stdout_fd = out.child_fd.get();
    request.stderr_fd = err.child_fd.get();
    request.death_signal = SIGKILL;
    request.cgroup_fd = guard_.cgroup_dir_fd();
    request.cgroup_procs_fd = guard_.cgroup_procs_fd();
    request.affinity = w.cpu_affinity.empty() ? nullptr : &affinity;
    child = spawn_process(request, who);
    guard_.watch(child->pid);
  }
  out.child_fd.reset();
  err.child_fd.reset();
  const pid_t pid = child->pid;

  auto worker = std::make_shared<Child>();
  worker->local_rank = w.local_rank;
  worker->pid = pid;
  worker->stdin_mode = w.stdin_mode;
  if (w.stdin_mode == WorkerLaunch::Stdin::kTerminal) terminal_.give(pid);  // done by a fresh child already
  worker->pidfd = std::make_unique<asio::posix::stream_descriptor>(io_, child->pidfd.release());
  for (auto* s : {&out, &err}) {
    if (s->pipe_read.get() < 0) continue;
    const int console_fd = s == &out ? STDOUT_FILENO : STDERR_FILENO;
    worker->pumps.push_back(std::make_shared<OutputPump>(
        io_, std::move(s->pipe_read), console_fd, s == &out ? w.stdout_prefix : w.stderr_prefix,
        std::move(s->tee_file), s == &out ? w.stdout_duplicate : w.stderr_duplicate));
    worker->pumps.back()->start();
  }
  workers_[pid] = worker;
  ++running_;
  watch(worker);
  spdlog::debug("local_rank {}: started {} as pid {}", w.local_rank, exe, pid);
  return pid;
}

std::optional<SpawnedProcess> ProcessContext::Impl::release_standby(const WorkerLaunch& w, int out_fd,
                                                                    int err_fd) {
  auto it = standbys_.find(w.local_rank);
  if (it == standbys_.end()) return std::nullopt;
  std::unique_ptr<StandbyEntry> entry = std::move(it->second);
  standbys_.erase(it);
  if (standby_fits(entry->standby, w)) {
    try {
      release(entry->standby, w, out_fd, err_fd);
      // Its exit is a worker's exit from now on: the standby's own wait is cancelled (and ignored).
      SpawnedProcess child{entry->standby.pid, UniqueFd(entry->watch->release())};
      spdlog::debug("local_rank {}: released the pre-started pid {}", w.local_rank, child.pid);
      return child;
    } catch (const std::system_error& e) {
      spdlog::warn("{}; starting local_rank {} afresh", e.what(), w.local_rank);
    }
  }
  end_standby(*entry);
  return std::nullopt;
}

void ProcessContext::Impl::prestart(const WorkerLaunch& like, size_t interpreter_args,
                                    const std::filesystem::path& stub) {
  if (closed_) throw std::logic_error("prestart: the process context is closed");
  if (auto it = standbys_.find(like.local_rank); it != standbys_.end()) {
    end_standby(*it->second);
    standbys_.erase(it);
  }
  auto entry = std::make_unique<StandbyEntry>();
  entry->standby =
      start_standby(like, interpreter_args, stub, guard_.cgroup_dir_fd(), guard_.cgroup_procs_fd());
  guard_.watch(entry->standby.pid);
  entry->watch = std::make_unique<asio::posix::stream_descriptor>(io_, entry->standby.pidfd.release());
  const int local_rank = like.local_rank;
  const pid_t pid = entry->standby.pid;
  entry->watch->async_wait(asio::posix::descriptor_base::wait_read,
                           [weak = weak_from_this(), local_rank, pid](auto ec) {
                             auto self = weak.lock();
                             if (ec || !self || self->closed_) return;
                             self->on_standby_exited(local_rank, pid);
                           });
  spdlog::debug("local_rank {}: pre-started pid {}", local_rank, pid);
  standbys_[local_rank] = std::move(entry);
}

void ProcessContext::Impl::on_standby_exited(int local_rank, pid_t pid) {
  auto it = standbys_.find(local_rank);
  if (it == standbys_.end() || it->second->standby.pid != pid) return;
  siginfo_t info{};
  while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  ExitStatus status;
  if (info.si_code == CLD_EXITED) {
    status.exit_code = info.si_status;
  } else {
    status.signal = info.si_status;
  }
  spdlog::warn(
      "the pre-started worker of local_rank {} (pid {}) ended with {} before it was needed; local_rank {} "
      "will start afresh",
      local_rank, pid, status.describe(), local_rank);
  end_standby(*it->second);
  standbys_.erase(it);
}

// SIGKILLs what is left of a standby's process group, reaps it and closes its socket.
void ProcessContext::Impl::end_standby(StandbyEntry& entry) {
  const pid_t pid = entry.standby.pid;
  ::kill(-pid, SIGKILL);
  wait_reaped(pid);
  guard_.forget(pid);
  entry.watch.reset();
  entry.standby.channel.reset();
}

std::vector<int> ProcessContext::Impl::standbys() const {
  std::vector<int> ranks;
  for (const auto& [local_rank, entry] : standbys_) ranks.push_back(local_rank);
  return ranks;
}

void ProcessContext::Impl::watch(const std::shared_ptr<Child>& worker) {
  worker->pidfd->async_wait(asio::posix::descriptor_base::wait_read,
                            [weak = weak_from_this(), worker](auto ec) {
                              auto self = weak.lock();
                              if (ec || !self || self->closed_) return;
                              self->on_exited(worker);
                            });
}

void ProcessContext::Impl::on_exited(const std::shared_ptr<Child>& worker) {
  siginfo_t info{};
  int r;
  do {
    r = ::waitid(P_PID, static_cast<id_t>(worker->pid), &info, WEXITED | WNOWAIT);
  } while (r < 0 && errno == EINTR);
  ExitStatus status;
  if (r < 0) {
    spdlog::error(
        "local_rank {} (pid {}): exit status lost ({}): was SIGCHLD ignored or a worker reaped "
        "elsewhere?",
        worker->local_rank, worker->pid, strerror(errno));
    worker->reaped = true;
    status.exit_code = 255;
  } else if (info.si_code == CLD_EXITED) {
    status.exit_code = info.si_status;
  } else {
    status.signal = info.si_status;
  }
  worker->pidfd.reset();
  for (auto& pump : worker->pumps) pump->drain_available();
  if (terminal_.holder() == worker->pid) terminal_.take_back();
  worker->exited = true;
  --running_;
  // on_exit first, then (posted) the done of a stop that this exit completes.
  maybe_finish_stop();
  if (on_exit_) on_exit_(worker->local_rank, worker->pid, status);
}

void ProcessContext::Impl::watch_stops() {
  sigchld_.async_wait([weak = weak_from_this()](auto ec, int) {
    auto self = weak.lock();
    if (ec || !self || self->closed_) return;
    for (const auto& [pid, worker] : self->workers_) {
      if (!worker->exited) self->on_stopped_or_continued(*worker);
    }
    self->watch_stops();
  });
}

// Consumes the worker's stop and continue reports (never its exit: no WEXITED) and acts on the last one.
void ProcessContext::Impl::on_stopped_or_continued(Child& worker) {
  std::optional<int> stop_signal;
  bool continued = false;
  while (true) {
    siginfo_t info{};
    const int r = ::waitid(P_PID, static_cast<id_t>(worker.pid), &info, WSTOPPED | WCONTINUED | WNOHANG);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || info.si_pid == 0) break;
    if (info.si_code == CLD_STOPPED) {
      stop_signal = info.si_status;
      continued = false;
    } else if (info.si_code == CLD_CONTINUED) {
      continued = true;
    }
  }
  if (stop_signal && !continued) {
    worker.stopped = true;
    spdlog::error("{}", stop_message(worker.local_rank, worker.pid, *stop_signal, worker.stdin_mode));
    // While it is stopped the agent holds the terminal: Ctrl-C reaches the agent, which stops the job.
    if (terminal_.holder() == worker.pid) terminal_.take_back();
  } else if (continued && worker.stopped) {
    worker.stopped = false;
    spdlog::info("local_rank {} (pid {}) continues", worker.local_rank, worker.pid);
    if (worker.stdin_mode == WorkerLaunch::Stdin::kTerminal && !stopping_) terminal_.give(worker.pid);
  }
}

void ProcessContext::Impl::signal_all(int sig) {
  for (const auto& [pid, worker] : workers_) {
    if (worker->exited) continue;
    ::kill(-pid, sig);
    if (worker->stopped && sig != SIGKILL && sig != SIGCONT) ::kill(-pid, SIGCONT);
  }
}

void ProcessContext::Impl::stop(int sig, std::chrono::milliseconds grace, std::function<void()> done) {
  if (closed_) return;
  if (done) done_.push_back(std::move(done));
  const auto deadline = std::chrono::steady_clock::now() + grace;
  if (!stopping_ || deadline < deadline_) {
    stopping_ = true;
    deadline_ = deadline;
    if (running_ > 0) arm_grace_timer();
  }
  if (running_ > 0) {
    spdlog::info("stopping {} worker(s) with {} ({} ms grace)", running_, signal_name(sig), grace.count());
    signal_all(sig);
  }
  maybe_finish_stop();
}

void ProcessContext::Impl::arm_grace_timer() {
  grace_timer_.expires_at(deadline_);
  grace_timer_.async_wait([weak = weak_from_this()](auto ec) {
    auto self = weak.lock();
    if (ec || !self || self->closed_) return;
    self->on_grace_expired();
  });
}

void ProcessContext::Impl::on_grace_expired() {
  // A wait cancelled by a re-arm may still complete: only the current deadline counts.
  if (!stopping_ || running_ == 0 || std::chrono::steady_clock::now() < deadline_) return;
  spdlog::warn("{} worker(s) still running after the grace period: sending SIGKILL", running_);
  signal_all(SIGKILL);
}

void ProcessContext::Impl::maybe_finish_stop() {
  if (!stopping_ || running_ > 0) return;
  stopping_ = false;
  grace_timer_.cancel();
  reap_exited();
  for (auto& done : std::exchange(done_, {})) {
    asio::post(io_, [weak = weak_from_this(), done = std::move(done)] {
      auto self = weak.lock();
      if (self && !self->closed_) done();
    });
  }
}

void ProcessContext::Impl::reap_exited() {
  for (auto it = workers_.begin(); it != workers_.end();) {
    Child& worker = *it->second;
    if (!worker.exited) {
      ++it;
      continue;
    }
    // The zombie still holds pid and process-group id: this kills only the worker's own leftovers.
    if (!worker.reaped) {
      ::kill(-worker.pid, SIGKILL);
      wait_reaped(worker.pid);
    }
    guard_.forget(worker.pid);
    for (auto& pump : worker.pumps) {
      if (!pump->finished()) draining_.push_back(pump);
    }
    it = workers_.erase(it);
  }
  std::erase_if(draining_, [](const auto& pump) { return pump->finished(); });
}

std::vector<pid_t> ProcessContext::Impl::pids() const {
  std::vector<pid_t> result;
  for (const auto& [pid, worker] : workers_) {
    if (!worker->exited) result.push_back(pid);
  }
  return result;
}

void ProcessContext::Impl::close() {
  if (closed_) return;
  closed_ = true;
  grace_timer_.cancel();
  boost::system::error_code ignored;
  sigchld_.cancel(ignored);
  terminal_.take_back();
  for (const auto& [pid, worker] : workers_) {
    if (!worker->reaped) ::kill(-pid, SIGKILL);
  }
  for (const auto& [pid, worker] : workers_) {
    if (!worker->reaped) wait_reaped(pid);
    guard_.forget(pid);
    worker->pidfd.reset();
    for (auto& pump : worker->pumps) pump->close();
  }
  for (auto& pump : draining_) pump->close();
  for (auto& [local_rank, entry] : standbys_) end_standby(*entry);
  standbys_.clear();
  workers_.clear();
  draining_.clear();
  running_ = 0;
  done_.clear();
}

ProcessContext::ProcessContext(asio::io_context& io, ExitFn on_exit)
    : impl_(std::make_shared<Impl>(io, std::move(on_exit))) {
  impl_->start();
}

ProcessContext::~ProcessContext() {
  impl_->close();
}

pid_t ProcessContext::spawn(const WorkerLaunch& w) {
  return impl_->spawn(w);
}
void ProcessContext::prestart(const WorkerLaunch& like, size_t interpreter_args,
                              const std::filesystem::path& stub) {
  impl_->prestart(like, interpreter_args, stub);
}
std::vector<int> ProcessContext::standbys() const {
  return impl_->standbys();
}
void ProcessContext::signal_all(int sig) {
  impl_->signal_all(sig);
}
void ProcessContext::stop(int sig, std::chrono::milliseconds grace, std::function<void()> done) {
  impl_->stop(sig, grace, std::move(done));
}
size_t ProcessContext::running() const {
  return impl_->running();
}
std::vector<pid_t> ProcessContext::pids() const {
  return impl_->pids();
}

}  // namespace ddprun::agent
