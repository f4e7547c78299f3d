#include "agent/process/run_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "agent/process/worker_launch.h"
#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

using Clock = std::chrono::steady_clock;

namespace {

// One read of the command's output into `output` (up to run.max_output); true when it read something.
bool drain(const CommandRun& run, int in, std::string& output, bool& eof) {
  char buf[4096];
  const ssize_t r = ::read(in, buf, sizeof buf);
  if (r > 0 && output.size() < run.max_output) {
    output.append(buf, std::min(static_cast<size_t>(r), run.max_output - output.size()));
  }
  if (r == 0) eof = true;
  return r > 0;
}

// Starts `run` with stdin from /dev/null and its stdout (when captured) and stderr into `out`; 0 or the
// spawn's errno.
int spawn_command(const CommandRun& run, int out, pid_t& pid) {
  std::vector<std::string> env_strings;
  env_strings.reserve(run.env.size());
  for (const auto& [k, v] : run.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> arg_strings = run.argv;
  std::vector<char*> argv;
  for (auto& a : arg_strings) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (run.capture_stdout) {
    posix_spawn_file_actions_adddup2(&actions, out, 1);
  } else {
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  }
  posix_spawn_file_actions_adddup2(&actions, out, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Default dispositions and an empty signal mask in the child, whatever the agent blocks or ignores.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
  if (run.new_process_group) {
    posix_spawnattr_setpgroup(&attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attr, flags);
  const int error = ::posix_spawn(&pid, run.exe.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return error;
}

// Reads `in` into `output` (up to run.max_output) until `pid` exits (its pidfd turns readable; without one,
// Linux < 5.3, the exit is looked at every 5 ms) or run.deadline passes. True when it exited; not reaped.
bool await_exit(const CommandRun& run, pid_t pid, int in, std::string& output, bool& eof) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  const auto until = Clock::now() + run.deadline;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd fds[2];
    nfds_t nfds = 0;
    int pipe_at = -1, pid_at = -1;
    if (!eof) {
      fds[nfds] = {in, POLLIN, 0};
      pipe_at = static_cast<int>(nfds++);
    }
    if (pidfd.get() >= 0) {
      fds[nfds] = {pidfd.get(), POLLIN, 0};
      pid_at = static_cast<int>(nfds++);
    }
    const int timeout = static_cast<int>(pid_at >= 0 ? left : std::min<long long>(left, 5));
    if (::poll(fds, nfds, timeout) < 0 && errno != EINTR) return false;
    if (pipe_at >= 0 && fds[pipe_at].revents != 0) drain(run, in, output, eof);
    if (pid_at >= 0) {
      if (fds[pid_at].revents != 0) return true;
    } else {
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == pid)
        return true;
    }
  }
}

}  // namespace

int run_command(const CommandRun& run, std::string& output) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return -2 - errno;
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  pid_t pid = -1;
  if (const int error = spawn_command(run, write_end.get(), pid); error != 0) return -2 - error;
  write_end.reset();
  bool eof = false;
  const bool exited = await_exit(run, pid, read_end.get(), output, eof);
  if (!exited) ::kill(run.new_process_group ? -pid : pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!exited) return kCommandTimedOut;
  // What it wrote before it exited is in the pipe now.
  ::fcntl(read_end.get(), F_SETFL, O_NONBLOCK);
  while (!eof && drain(run, read_end.get(), output, eof)) {
  }
  return status;
}

std::string command_outcome(int status, std::chrono::milliseconds deadline) {
  if (status == kCommandTimedOut) return "did not finish within " + duration_text(deadline);
  if (status < kCommandTimedOut) return std::string("could not be started: ") + std::strerror(-2 - status);
  if (WIFSIGNALED(status)) return "was killed by " + signal_name(WTERMSIG(status));
  return "exited with " + std::to_string(WEXITSTATUS(status));
}

}  // namespace ddprun::agent
