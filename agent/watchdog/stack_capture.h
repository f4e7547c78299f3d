// Asking running workers where they are, and reading the answers back (the formats:
// agent/watchdog/stack_dump.h).
//
// A worker whose /proc/<pid>/status says it catches `python_signal` (the stack-dump hook the agent put on its
// PYTHONPATH is installed) gets that signal; faulthandler then writes every thread's stack to its stderr, and
// so to its stderr log. Any other worker (a C++ program, Python started with -I or -E) is read with gdb when
// gdb is on the PATH: `gdb -p <pid> -batch -nx -ex "thread apply all bt"`, appended to its stderr log, 15 s
// at most each (attaching needs ptrace rights: root, or kernel.yama.ptrace_scope 0). Without either it has no
// stack.
//
// A torch NCCL worker with the flight recorder's dump pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe, set
// by the agent with --hang_timeout) is also asked for its NCCL trace, which torch writes to
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank> in the rank's log directory.
//
// Blocking: up to `wait` for the Python dumps to appear, plus the gdb runs. Never throws (what fails is
// missing from the result). Call from one thread at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <vector>

#include "agent/watchdog/stack_dump.h"

namespace ddprun::agent {

struct StackTarget {
  int rank = 0;
  pid_t pid = 0;
  std::filesystem::path stderr_log;
  std::filesystem::path nccl_dump_pipe;  // "" or torch's flight-recorder pipe of this rank (may not exist)
};

// Global rank -> the main thread's stack (absent or empty when none could be read).
std::map<int, Stack> capture_stacks(const std::vector<StackTarget>& targets, int python_signal,
                                    std::chrono::milliseconds wait = std::chrono::seconds(3));

// /proc/<pid>/status's SigCgt has `sig`.
bool catches_signal(pid_t pid, int sig);

}  // namespace ddprun::agent
