// StateGuard: the agent's state directory (agent/state/state_directory.h) is removed when the agent dies
// without removing it itself (SIGKILL, the OOM killer): the directory lives in memory (/dev/shm), and a job's
// state left there would hold that memory until the machine restarts.
//
// The guard is a process of its own ("ddprun-state-guard" in /proc/<pid>/comm and cmdline, its own process
// group, every catchable signal ignored, an empty environment, no fd but the read end of a pipe from the
// agent): at end of file on the pipe it removes the directory and exits; the byte 'q' first (the destructor:
// the agent removed the directory itself) makes it exit without touching anything. It is the agent's
// program run again (agent/process/self_exec.h): main() must call state_guard_entry() first. Where main() did
// not (unit tests), no guard is started: the directory is removed by the owner only.
//
// Threads: construct and destroy on one thread. Errors: a guard that cannot be started is logged (the job
// runs on; the directory would outlive a SIGKILL), never thrown.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>

#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

// For main(), first thing (with guard_entry): when argv[0] is "ddprun-state-guard", runs the guard (argv[1]:
// the directory) and returns its exit code; otherwise returns nullopt.
std::optional<int> state_guard_entry(int argc, char** argv);

class StateGuard {
 public:
  explicit StateGuard(const std::filesystem::path& dir);
  // Tells the guard to exit without removing anything, and reaps it.
  ~StateGuard();
  StateGuard(const StateGuard&) = delete;
  StateGuard& operator=(const StateGuard&) = delete;

  pid_t pid() const { return pid_; }  // -1: none

 private:
  pid_t pid_ = -1;
  UniqueFd pipe_;  // the write end
};

}  // namespace ddprun::agent
