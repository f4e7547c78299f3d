#include "agent/process/terminal.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>

namespace ddprun::agent {

WorkerLaunch::Stdin worker_stdin(int local_rank, bool foreground_terminal) {
  if (!foreground_terminal) return WorkerLaunch::Stdin::kInherit;
  return local_rank == 0 ? WorkerLaunch::Stdin::kTerminal : WorkerLaunch::Stdin::kNull;
}

bool stdin_is_foreground_terminal() {
  return ::isatty(STDIN_FILENO) == 1 && ::tcgetpgrp(STDIN_FILENO) == ::getpgrp();
}

bool is_terminal_interrupt(int sig) {
  return sig == SIGINT || sig == SIGQUIT;
}

std::string stop_message(int local_rank, pid_t pid, int sig, WorkerLaunch::Stdin stdin_mode) {
  const std::string who = "local_rank " + std::to_string(local_rank) + " (pid " + std::to_string(pid) + ")";
  std::string why;
  switch (sig) {
    case SIGTTIN:
    case SIGTTOU:
      why = sig == SIGTTIN ? "it read the terminal" : "it changed the terminal's settings";
      why +=
          stdin_mode == WorkerLaunch::Stdin::kInherit
              ? ", but ddprun is not the terminal's foreground job (started in the background?); run ddprun "
                "in the foreground, or give it stdin from a file or /dev/null"
              : ", which only local_rank 0 may use under ddprun (the other local ranks read end of file on "
                "stdin); read input in local_rank 0 only";
      break;
    case SIGTSTP:
      why = "Ctrl-Z suspends only the worker that holds the terminal under ddprun, not the job";
      break;
    default:
      why = "someone stopped it (kill -STOP, a debugger)";
  }
  return who + " is stopped by " + signal_name(sig) + ": " + why +
         ". The job waits for it: resume it with `kill "
         "-CONT " +
         std::to_string(pid) + "`, or stop the job with Ctrl-C";
}

namespace {

// tcsetpgrp(0, pgid) with SIGTTOU blocked in this thread (the kernel then lets a background group do it).
bool set_foreground(pid_t pgid) {
  sigset_t ttou, saved;
  sigemptyset(&ttou);
  sigaddset(&ttou, SIGTTOU);
  ::pthread_sigmask(SIG_BLOCK, &ttou, &saved);
  const int r = ::tcsetpgrp(STDIN_FILENO, pgid);
  const int error = errno;
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  errno = error;
  return r == 0;
}

}  // namespace

void TerminalForeground::give(pid_t pgid) {
  if (!set_foreground(pgid)) {
    spdlog::warn("cannot give the terminal to process group {}: {}; a read of the terminal will stop it",
                 pgid, strerror(errno));
    return;
  }
  holder_ = pgid;
}

void TerminalForeground::take_back() {
  if (holder_ == 0) return;
  holder_ = 0;
  if (!set_foreground(::getpgrp()) && errno != ENOTTY && errno != EIO) {
    spdlog::warn("cannot take the terminal back from the workers: {}", strerror(errno));
  }
}

}  // namespace ddprun::agent
