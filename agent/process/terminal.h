// Terminal input for the workers. torchrun's workers share its process group, and so its terminal; each
// ddprun worker leads a process group of its own, outside the terminal's foreground, where a read of the
// terminal stops it (SIGTTIN). So, when the agent's stdin is a terminal whose foreground is the agent's
// group, local rank 0 becomes the *terminal holder*: its group is made the terminal's foreground while it
// runs (Ctrl-C then reaches local rank 0 only), and every other local rank reads /dev/null (end of file).
//
// Pure: worker_stdin() and stop_message() decide and word; they touch nothing.
// Probe and executor: stdin_is_foreground_terminal() and TerminalForeground (tcgetpgrp/tcsetpgrp on fd 0).
// Threads: the free functions are thread-safe; a TerminalForeground belongs to one thread.
#pragma once

#include <sys/types.h>

#include <string>

#include "agent/process/worker_launch.h"

namespace ddprun::agent {

// What local_rank's stdin is: with a foreground terminal, kTerminal for local rank 0 and kNull for the
// others; without one, kInherit (the agent's stdin, whatever it is).
WorkerLaunch::Stdin worker_stdin(int local_rank, bool foreground_terminal);

// True when fd 0 is a terminal and the calling process's group is its foreground group.
bool stdin_is_foreground_terminal();

// Whether the terminal holder ending by `sig` means the user interrupted the job (Ctrl-C, Ctrl-\): SIGINT
// (Python's KeyboardInterrupt exits by re-raising it) and SIGQUIT.
bool is_terminal_interrupt(int sig);

// The error line for a worker stopped by `sig` (SIGTTIN, SIGTTOU, SIGTSTP, SIGSTOP, ...): names the local
// rank, the pid, the signal, why it stops there and what to do. `stdin_mode` is the worker's.
std::string stop_message(int local_rank, pid_t pid, int sig, WorkerLaunch::Stdin stdin_mode);

// The terminal on fd 0: give(pgid) makes pgid its foreground group, take_back() (and the destructor) the
// calling process's own group again, once it was given. SIGTTOU is blocked in the calling thread around each
// tcsetpgrp (a background group may set the foreground then). Failures (the terminal hung up, the group is
// gone) are logged as warnings, not thrown.
class TerminalForeground {
 public:
  TerminalForeground() = default;
  ~TerminalForeground() { take_back(); }
  TerminalForeground(const TerminalForeground&) = delete;
  TerminalForeground& operator=(const TerminalForeground&) = delete;

  void give(pid_t pgid);
  void take_back();
  pid_t holder() const { return holder_; }  // the group it was given to; 0: the agent's own

 private:
  pid_t holder_ = 0;
};

}  // namespace ddprun::agent
