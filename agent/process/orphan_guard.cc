#include "agent/process/orphan_guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <system_error>
#include <vector>

#include "agent/process/linux_syscalls.h"
#include "agent/process/process_tree.h"
#include "agent/process/worker_cgroup.h"

namespace ddprun::agent {
namespace {

constexpr const char* kGuardName = "ddprun-guard";
enum Op : int32_t { kWatch = 1, kForget = 2, kQuit = 3 };
struct Message {
  int32_t op;
  int32_t pgid;
};
constexpr int kMaxGroups = 4096;
constexpr int kCleanupTimeoutMs = 10000;

// Set by guard_entry: /proc/self/exe runs the guard when called "ddprun-guard".
std::atomic<bool> g_exec_self{false};

// What the guard process knows. Filled before the fork (or from argv after exec): no allocation after.
struct GuardState {
  char cgroup_dir[4096] = "";
  pid_t groups[kMaxGroups];
  int count = 0;
};

void add_group(GuardState& s, pid_t pgid) {
  if (s.count < kMaxGroups) s.groups[s.count++] = pgid;
}

// In the guard's child, before it runs: only `socket_fd` stays open, as fd 0; 1 and 2 are /dev/null (an
// inherited socket or pipe end must not be held open by the guard).
void keep_only_socket(int socket_fd) {
  ::dup2(socket_fd, 0);
  const int null_fd = ::open("/dev/null", O_RDWR);
  if (null_fd >= 0) {
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
  }
  ::syscall(SYS_close_range, 3U, ~0U, 0U);
}

// Starts the guard as /proc/self/exe named `argv[0]`, with vfork: no copy of the agent's memory, the agent
// waits only until the exec. Signals stay blocked in the child, whose handlers are the agent's until the exec
// (the guard ignores them). Its own function so that no variable of the caller lives across vfork (GCC's
// -Wclobbered). The child's pid, or -1 with errno.
pid_t vfork_exec_guard(int socket_fd, char* const* argv) {
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &saved);
  const pid_t pid = ::vfork();
  if (pid == 0) {
    keep_only_socket(socket_fd);
    char* envp[] = {nullptr};
    ::execve("/proc/self/exe", argv, envp);
    ::_exit(127);  // a vfork child must not return into the agent's stack
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  errno = fork_errno;
  return pid;
}

// The guard's whole life, reading messages on fd 0. Async-signal-safe calls only (it may run in a forked
// child of a multi-threaded process).
[[noreturn]] void run_guard(GuardState& s) {
  ::setpgid(0, 0);  // a terminal's Ctrl-C or a kill of the agent's group must not take the guard along
  ::prctl(PR_SET_NAME, kGuardName);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &ignore, nullptr);
  }
  Message m{};
  while (true) {
    const ssize_t n = ::recv(0, &m, sizeof m, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof m)) break;  // end of file: the agent is gone
    if (m.op == kQuit) ::_exit(0);
    if (m.op == kWatch) {
      add_group(s, m.pgid);
    } else if (m.op == kForget) {
      for (int i = 0; i < s.count; ++i) {
        if (s.groups[i] == m.pgid) {
          s.groups[i] = s.groups[--s.count];
          break;
        }
      }
    }
  }
  if (s.cgroup_dir[0] != '\0') kill_cgroup_and_remove(s.cgroup_dir, kCleanupTimeoutMs);
  for (int i = 0; i < s.count; ++i) ::kill(-s.groups[i], SIGKILL);
  ::_exit(0);
}

std::string pid_list(const std::set<pid_t>& pids) {
  std::string out;
  for (pid_t pid : pids) out += (out.empty() ? "" : ",") + std::to_string(pid);
  return out;
}

}  // namespace

std::optional<int> guard_entry(int argc, char** argv) {
  const std::string_view arg0 = argc > 0 ? argv[0] : "";
  if (arg0 != kGuardName) {
    g_exec_self = true;
    return std::nullopt;
  }
  // ddprun-guard [--cgroup=DIR] [--watch=PGID,PGID,...]
  static GuardState state;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--cgroup=") && a.size() - 9 < sizeof state.cgroup_dir) {
      ::memcpy(state.cgroup_dir, a.data() + 9, a.size() - 9);
      state.cgroup_dir[a.size() - 9] = '\0';
    } else if (a.starts_with("--watch=")) {
      for (const char* p = a.data() + 8; *p != '\0';) {
        char* end = nullptr;
        const long pgid = std::strtol(p, &end, 10);
        if (end == p) break;
        add_group(state, static_cast<pid_t>(pgid));
        p = *end == ',' ? end + 1 : end;
      }
    }
  }
  run_guard(state);
}

OrphanGuard::OrphanGuard() : cgroup_(WorkerCgroup::create()) {
  if (cgroup_) {
    spdlog::debug("the workers run in cgroup {}", cgroup_->path().string());
  } else if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    spdlog::warn(
        "no cgroup for the workers and PR_SET_CHILD_SUBREAPER failed ({}): a worker's descendant that "
        "leaves its process group may outlive ddprun",
        strerror(errno));
  }
  stop_.reset(::eventfd(0, EFD_CLOEXEC));
  if (stop_.get() < 0) throw std::system_error(errno, std::generic_category(), "orphan guard: eventfd");
  {
    std::lock_guard lock(mu_);
    start_guard();
  }
  if (guard_pid_ < 0)
    throw std::system_error(errno, std::generic_category(), "orphan guard: cannot start it");
  monitor_ = std::thread([this] { monitor(); });
}

OrphanGuard::~OrphanGuard() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_.get(), &one, sizeof one);
  monitor_.join();
  kill_leftovers();
  cgroup_.reset();  // removes the directory
  std::lock_guard lock(mu_);
  send(kQuit, 0);
  socket_.reset();
  if (guard_pid_ > 0) {
    while (::waitpid(guard_pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

int OrphanGuard::cgroup_dir_fd() const {
  return cgroup_ ? cgroup_->dir_fd() : -1;
}

int OrphanGuard::cgroup_procs_fd() const {
  return cgroup_ ? cgroup_->procs_fd() : -1;
}

pid_t OrphanGuard::guard_pid() const {
  std::lock_guard lock(mu_);
  return guard_pid_;
}

void OrphanGuard::start_guard() {
  guard_pid_ = -1;
  guard_pidfd_.reset();
  socket_.reset();
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    spdlog::error("orphan guard: socketpair: {}", strerror(errno));
    return;
  }
  UniqueFd ours(sv[0]), theirs(sv[1]);
  // Everything the child needs is made here: after fork it may not allocate.
  auto state = std::make_unique<GuardState>();  // for a guard that is not exec'd (the child's copy)
  std::vector<std::string> args{kGuardName};
  if (cgroup_) {
    const std::string dir = cgroup_->path().string();
    args.push_back("--cgroup=" + dir);
    ::strncpy(state->cgroup_dir, dir.c_str(), sizeof state->cgroup_dir - 1);
  }
  if (!watched_.empty()) args.push_back("--watch=" + pid_list(watched_));
  for (pid_t pgid : watched_) add_group(*state, pgid);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = g_exec_self ? vfork_exec_guard(theirs.get(), argv.data()) : ::fork();
  if (pid < 0) {
    spdlog::error("orphan guard: fork: {}", strerror(errno));
    return;
  }
  if (pid == 0) {  // fork: this copy of the agent's program is the guard
    keep_only_socket(theirs.get());
    run_guard(*state);
  }
  guard_pid_ = pid;
  guard_pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  socket_ = std::move(ours);
}

void OrphanGuard::monitor() {
  while (true) {
    pollfd fds[2] = {{stop_.get(), POLLIN, 0}, {guard_pidfd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;
    if (fds[1].revents == 0) continue;
    std::lock_guard lock(mu_);
    int status = 0;
    while (::waitpid(guard_pid_, &status, 0) < 0 && errno == EINTR) {
    }
    spdlog::warn("the orphan guard (pid {}) died ({}): starting another", guard_pid_,
                 WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                     : "exit code " + std::to_string(WEXITSTATUS(status)));
    start_guard();
    if (guard_pid_ < 0) {
      spdlog::error("no orphan guard: what the workers start may outlive a SIGKILLed ddprun");
      return;
    }
  }
}

void OrphanGuard::send(int op, pid_t pgid) {
  if (socket_.get() < 0) return;
  Message m{op, static_cast<int32_t>(pgid)};
  ssize_t n;
  do {
    n = ::send(socket_.get(), &m, sizeof m, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  // A guard that is gone is restarted by the monitor thread with the current watch list.
}

void OrphanGuard::watch(pid_t pgid) {
  std::lock_guard lock(mu_);
  watched_.insert(pgid);
  ever_watched_.insert(pgid);
  send(kWatch, pgid);
}

void OrphanGuard::forget(pid_t pgid) {
  std::lock_guard lock(mu_);
  watched_.erase(pgid);
  send(kForget, pgid);
  if (!cgroup_) reap_adopted();
}

void OrphanGuard::reap_adopted() {
  const pid_t self = ::getpid();
  for (const ProcStat& s : read_process_table()) {
    if (s.ppid == self && s.state == 'Z' && s.pid != guard_pid_ && ever_watched_.count(s.pgrp) != 0 &&
        watched_.count(s.pid) == 0) {
      ::waitpid(s.pid, nullptr, WNOHANG);
    }
  }
}

void OrphanGuard::kill_leftovers() {
  std::lock_guard lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kCleanupTimeoutMs);
  bool done;
  if (cgroup_) {
    done = cgroup_->kill_all(deadline);
  } else {
    for (pid_t pgid : watched_) ::kill(-pgid, SIGKILL);
    done = kill_descendants(guard_pid_, deadline);
  }
  if (!done)
    spdlog::warn("some processes the workers started did not die within {} s", kCleanupTimeoutMs / 1000);
}

}  // namespace ddprun::agent
