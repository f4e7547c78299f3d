#include "agent/process/self_exec.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "agent/process/linux_syscalls.h"

namespace ddprun::agent {

namespace {
std::atomic<bool> g_exec_self{false};
}  // namespace

void enable_self_exec() {
  g_exec_self = true;
}

bool self_exec_enabled() {
  return g_exec_self;
}

void keep_only_fd0(int fd) {
  ::dup2(fd, 0);
  const int null_fd = ::open("/dev/null", O_RDWR);
  if (null_fd >= 0) {
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
  }
  ::syscall(SYS_close_range, 3U, ~0U, 0U);
}

// Its own function so that no variable of the caller lives across vfork (GCC's -Wclobbered).
pid_t exec_self(int fd0, char* const* argv) {
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &saved);
  const pid_t pid = ::vfork();
  if (pid == 0) {
    keep_only_fd0(fd0);
    char* envp[] = {nullptr};
    ::execve("/proc/self/exe", argv, envp);
    ::_exit(127);  // a vfork child must not return into the agent's stack
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  errno = fork_errno;
  return pid;
}

}  // namespace ddprun::agent
