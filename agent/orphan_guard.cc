#include "agent/orphan_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

#include <spdlog/spdlog.h>

namespace ddprun::agent {
namespace {

enum Op : int32_t { kWatch = 1, kForget = 2, kQuit = 3 };
struct Message {
  int32_t op;
  int32_t pgid;
};
constexpr int kMaxGroups = 4096;

// The guardian's whole life. Runs in a forked child of a multi-threaded process: async-signal-safe calls
// only (read, kill, close, _exit, sigaction, setpgid), no allocation.
[[noreturn]] void guardian(int read_fd) {
  ::setpgid(0, 0);  // a terminal's Ctrl-C or a kill of the agent's group must not take the guardian along
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &ignore, nullptr);
  }
  // Keep only the pipe: an inherited socket or pipe end must not be held open by the guardian.
  ::dup2(read_fd, 0);
  int null_fd = ::open("/dev/null", O_WRONLY);
  if (null_fd >= 0) {
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
  }
  ::syscall(SYS_close_range, 3U, ~0U, 0U);

  static pid_t groups[kMaxGroups];
  int count = 0;
  Message m{};
  while (true) {
    ssize_t n = ::read(0, &m, sizeof m);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof m)) break;  // end of file: the agent is gone
    if (m.op == kQuit) ::_exit(0);
    if (m.op == kWatch && count < kMaxGroups) {
      groups[count++] = m.pgid;
    } else if (m.op == kForget) {
      for (int i = 0; i < count; ++i) {
        if (groups[i] == m.pgid) {
          groups[i] = groups[--count];
          break;
        }
      }
    }
  }
  for (int i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);
  ::_exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "orphan guard: pipe");
  pid_ = ::fork();
  if (pid_ < 0) {
    int e = errno;
    ::close(p[0]);
    ::close(p[1]);
    throw std::system_error(e, std::generic_category(), "orphan guard: fork");
  }
  if (pid_ == 0) {
    ::close(p[1]);
    guardian(p[0]);
  }
  ::close(p[0]);
  fd_ = p[1];
}

OrphanGuard::~OrphanGuard() {
  send(kQuit, 0);
  ::close(fd_);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void OrphanGuard::send(int op, pid_t pgid) {
  if (broken_) return;
  Message m{op, static_cast<int32_t>(pgid)};
  ssize_t n;
  do {
    n = ::write(fd_, &m, sizeof m);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof m)) {
    broken_ = true;
    spdlog::warn("the orphan guard (pid {}) is gone: workers' children may outlive a killed agent", pid_);
  }
}

void OrphanGuard::watch(pid_t pgid) { send(kWatch, pgid); }
void OrphanGuard::forget(pid_t pgid) { send(kForget, pgid); }

}  // namespace ddprun::agent
