#include "agent/state/state_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

#include "agent/process/self_exec.h"

namespace ddprun::agent {

namespace {
constexpr const char* kGuardName = "ddprun-state-guard";
}  // namespace

std::optional<int> state_guard_entry(int argc, char** argv) {
  if (argc < 1 || std::string_view(argv[0]) != kGuardName) return std::nullopt;
  ::setpgid(0, 0);  // a kill of the agent's process group must not take the guard along
  ::prctl(PR_SET_NAME, kGuardName);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &ignore, nullptr);
  }
  char c = 0;
  ssize_t n = 0;
  while ((n = ::read(0, &c, 1)) < 0 && errno == EINTR) {
  }
  if (n == 1 && c == 'q') return 0;
  if (argc < 2) return 2;
  std::error_code ignored;
  std::filesystem::remove_all(argv[1], ignored);
  return 0;
}

StateGuard::StateGuard(const std::filesystem::path& dir) {
  if (!self_exec_enabled()) {
    spdlog::debug("no state guard (not started from ddprun's main): {} outlives a SIGKILL", dir.string());
    return;
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    spdlog::warn("cannot start the state guard (pipe: {}): {} would outlive a SIGKILL of the agent",
                 std::strerror(errno), dir.string());
    return;
  }
  UniqueFd read_end(fds[0]);
  pipe_.reset(fds[1]);
  std::string name = kGuardName, path = dir.string();
  char* argv[] = {name.data(), path.data(), nullptr};
  pid_ = exec_self(read_end.get(), argv);
  if (pid_ < 0) {
    spdlog::warn("cannot start the state guard ({}): {} would outlive a SIGKILL of the agent",
                 std::strerror(errno), dir.string());
    pipe_.reset();
  }
}

StateGuard::~StateGuard() {
  if (pid_ < 0) return;
  const char quit = 'q';
  [[maybe_unused]] const ssize_t n = ::write(pipe_.get(), &quit, 1);
  pipe_.reset();
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace ddprun::agent
