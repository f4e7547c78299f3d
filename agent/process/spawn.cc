#include "agent/process/spawn.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "agent/process/linux_syscalls.h"

namespace ddprun::agent {
namespace {

// The child runs on this much stack: a few syscalls, no allocation.
constexpr size_t kChildStack = 64 * 1024;

// What a child reports on its error pipe when a step before exec fails (nothing when exec succeeds: the pipe
// is close-on-exec). `step` is a string literal: the same address in the parent, with or without CLONE_VM.
struct ChildError {
  int error;
  const char* step;
};

struct ChildArgs {
  const SpawnRequest* request;
  pid_t parent;
  int report_fd;           // write end of the error pipe
  bool in_cgroup = false;  // started there by clone3(CLONE_INTO_CGROUP)
};

[[noreturn]] void child_fail(ChildArgs& args, const char* step) {
  const ChildError e{errno, step};
  [[maybe_unused]] ssize_t n = ::write(args.report_fd, &e, sizeof e);
  ::_exit(127);
}

// clone3(2)'s arguments (linux/sched.h's struct clone_args up to `cgroup`, Linux >= 5.7), declared here: the
// kernel header's CLONE_* macros collide with glibc's.
struct Clone3Args {
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size,
      cgroup;
};
constexpr uint64_t kCloneIntoCgroup = 0x200000000ULL;

// A fork-style child (no CLONE_VM: its own copy of the memory, returning 0 here like fork) created directly
// in the cgroup `cgroup_fd`, which costs no migration (writing cgroup.procs waits for an RCU grace period,
// several ms). CLONE_VFORK: the caller resumes once the child has exec'd or exited. -1 and errno on failure
// (ENOSYS, E2BIG or EINVAL on kernels without CLONE_INTO_CGROUP).
pid_t clone_into_cgroup(int cgroup_fd, int* pidfd) {
  Clone3Args a{};
  a.flags = CLONE_VFORK | (pidfd ? CLONE_PIDFD : 0) | kCloneIntoCgroup;
  a.pidfd = reinterpret_cast<uint64_t>(pidfd);
  a.exit_signal = SIGCHLD;
  a.cgroup = static_cast<uint64_t>(cgroup_fd);
  return static_cast<pid_t>(::syscall(SYS_clone3, &a, sizeof a));
}

bool no_clone_into_cgroup(int error) {
  return error == ENOSYS || error == E2BIG || error == EINVAL;
}

int child_main(void* raw) {
  auto& args = *static_cast<ChildArgs*>(raw);
  const SpawnRequest& r = *args.request;
  if (r.new_process_group && ::setpgid(0, 0) != 0) child_fail(args, "setpgid");
  // Before exec, so that the worker never reads the terminal from the background; SIGTTOU is blocked here.
  if (r.new_process_group && r.take_terminal) ::tcsetpgrp(STDIN_FILENO, ::getpid());
  // The agent's handlers must not run in the child; ignored signals stay ignored except these two.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    const bool has_handler =
        (old.sa_flags & SA_SIGINFO) || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    if (has_handler || sig == SIGPIPE || sig == SIGXFSZ) ::sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) child_fail(args, "sigprocmask");
  if (r.death_signal != 0) {
    if (::prctl(PR_SET_PDEATHSIG, r.death_signal) != 0) child_fail(args, "prctl(PR_SET_PDEATHSIG)");
    if (::getppid() != args.parent) ::_exit(127);  // the agent died before prctl: nobody to run for
  }
  if (!args.in_cgroup && r.cgroup_procs_fd >= 0 && ::write(r.cgroup_procs_fd, "0", 1) != 1) {
    child_fail(args, "join cgroup");
  }
  if (r.affinity != nullptr && ::sched_setaffinity(0, sizeof(cpu_set_t), r.affinity) != 0) {
    child_fail(args, "sched_setaffinity");
  }
  // Like Python's close_fds=True: no fd of the agent but 0-2 survives exec. Older kernels (< 5.11): skipped.
  ::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
  for (auto [fd, target] : {std::pair{r.stdin_fd, STDIN_FILENO}, std::pair{r.stdout_fd, STDOUT_FILENO},
                            std::pair{r.stderr_fd, STDERR_FILENO}, std::pair{r.fd3, 3}}) {
    if (fd < 0) continue;
    if (fd == target ? ::fcntl(fd, F_SETFD, 0) != 0 : ::dup2(fd, target) < 0) child_fail(args, "dup2");
  }
  ::execve(r.path, r.argv, r.envp);
  child_fail(args, "execve");
}

// Blocks every signal of the calling thread for its lifetime.
class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &saved_);
  }
  ~SignalsBlocked() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t saved_;
};

}  // namespace

ExecStrings::ExecStrings(std::vector<std::string> argv, const std::map<std::string, std::string>& env)
    : argv_(std::move(argv)) {
  for (const auto& [key, value] : env) env_.push_back(key + "=" + value);
  for (auto& s : argv_) argv_ptrs_.push_back(s.data());
  for (auto& s : env_) env_ptrs_.push_back(s.data());
  argv_ptrs_.push_back(nullptr);
  env_ptrs_.push_back(nullptr);
}

cpu_set_t cpu_set_of(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE)
      throw std::invalid_argument("CPU " + std::to_string(cpu) + " out of range");
    CPU_SET(cpu, &set);
  }
  return set;
}

SpawnedProcess spawn_process(const SpawnRequest& request, const std::string& who) {
  const std::string what = "'" + std::string(request.path ? request.path : "(null)") + "'";
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), who + ": pipe2 to start " + what);
  }
  UniqueFd report_read(report[0]), report_write(report[1]);
  ChildArgs args{&request, ::getpid(), report_write.get()};
  int pidfd = -1;
  pid_t pid = -1;
  int clone_errno = 0;
  {
    SignalsBlocked blocked;
    if (request.cgroup_fd >= 0) {
      pid = clone_into_cgroup(request.cgroup_fd, &pidfd);
      if (pid == 0) {
        args.in_cgroup = true;
        child_main(&args);
      }
      clone_errno = errno;
    }
    if (pid < 0 && (request.cgroup_fd < 0 || no_clone_into_cgroup(clone_errno))) {
      void* stack = ::mmap(nullptr, kChildStack, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
      if (stack == MAP_FAILED) {
        clone_errno = errno;
      } else {
        pid = ::clone(child_main, static_cast<char*>(stack) + kChildStack,
                      CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD, &args, &pidfd);
        clone_errno = errno;
        ::munmap(stack, kChildStack);
      }
    }
  }
  if (pid < 0)
    throw std::system_error(clone_errno, std::generic_category(), who + ": clone to start " + what);
  UniqueFd owned_pidfd(pidfd);
  report_write.reset();  // the child has exec'd or exited (CLONE_VFORK): its end is closed too
  ChildError failed{};
  ssize_t n;
  do {
    n = ::read(report_read.get(), &failed, sizeof failed);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof failed)) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    throw std::system_error(failed.error, std::generic_category(), who + ": " + failed.step + " of " + what);
  }
  return SpawnedProcess{pid, std::move(owned_pidfd)};
}

bool child_can_join_cgroup(int cgroup_fd, int procs_fd) {
  pid_t pid;
  {
    SignalsBlocked blocked;
    pid = clone_into_cgroup(cgroup_fd, nullptr);
    if (pid == 0) ::_exit(0);
    if (pid < 0 && no_clone_into_cgroup(errno)) {
      pid = ::vfork();  // the child only writes and exits
      if (pid == 0) ::_exit(::write(procs_fd, "0", 1) == 1 ? 0 : 1);
    }
  }
  if (pid < 0) return false;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace ddprun::agent
