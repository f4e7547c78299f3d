// run_command: one short helper program run to its end or a deadline, its output kept (the launcher's
// interpreter probes, the agent's --health_check). Not for workers: they are spawn_process'd and watched
// by the io thread.
//
// The child gets default signal dispositions and an empty signal mask whatever the agent blocks or ignores,
// stdin on /dev/null, and `env` as its whole environment. Its own exit decides: a descendant that keeps the
// output pipe open delays nothing. With new_process_group, the child leads a process group and a deadline
// kills the whole group (a shell's children too).
//
// Threads: any thread; no shared state. Never throws except std::bad_alloc.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace ddprun::agent {

struct CommandRun {
  std::string exe;                // a path (no PATH lookup: find_program)
  std::vector<std::string> argv;  // argv[0] included
  std::map<std::string, std::string> env;
  std::chrono::milliseconds deadline{30000};
  bool capture_stdout = false;  // stdout into the output too (else /dev/null); stderr always
  bool new_process_group = false;
  size_t max_output = 65536;  // bytes kept; the rest is read and dropped
};

// The wait status, or kCommandTimedOut when it outlived the deadline (killed and reaped), or -2 - errno when
// it could not be spawned. `output` gets what it wrote (max_output bytes at most).
constexpr int kCommandTimedOut = -1;
int run_command(const CommandRun& run, std::string& output);

// How a finished run_command ended, for messages: "exited with 3", "was killed by SIGSEGV", "did not finish
// within 30 s", "could not be started: No such file or directory".
std::string command_outcome(int status, std::chrono::milliseconds deadline);

}  // namespace ddprun::agent
