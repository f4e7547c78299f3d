// spawn_process: start one program at the cost of the kernel's process creation.
//
// The child is created with clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD) on a small private stack, which is
// what glibc's posix_spawn does: the agent's page tables are never copied (a fork of the agent costs more
// the bigger it is), and the calling thread is suspended only until the child has exec'd or failed.
// posix_spawn itself cannot be used: it has no PR_SET_PDEATHSIG and no CPU affinity.
// With cgroup_fd, the child is created in that cgroup instead (clone3 with CLONE_INTO_CGROUP | CLONE_VFORK,
// Linux >= 5.7): a fork-style child (its own copy of the page tables, no CLONE_VM), because moving a process
// into a cgroup afterwards (cgroup.procs) waits for an RCU grace period, several ms each. On older kernels
// it falls back to the clone above and the child writes cgroup_procs_fd.
//
// In the child, before exec, in this order (async-signal-safe calls only; the child may share the agent's
// memory until exec, so it writes nothing but its error report, on a close-on-exec pipe):
//   setpgid(0, 0) when new_process_group; tcsetpgrp(0, own pid) when take_terminal (failure ignored: the
//   parent, which also does it, reports it); every signal with a handler (and SIGPIPE, SIGXFSZ) back to
//   SIG_DFL, ignored signals stay ignored; an empty signal mask; prctl(PR_SET_PDEATHSIG, death_signal) and
//   the getppid() race check (the parent died before prctl: _exit); "0" written to cgroup_procs_fd when
//   given and the child is not already in the cgroup (the fallback); sched_setaffinity(affinity) when given;
//   close_range(3, ~0, CLOSE_RANGE_CLOEXEC) (Linux >= 5.11; skipped on older kernels); dup2 of
//   stdin_fd/stdout_fd/stderr_fd onto 0/1/2 and of fd3 onto 3; execve(path, argv, envp).
// The parent blocks every signal around the clone (a handler of the agent must never run on the child's
// stack in the agent's memory; also, with SIGTTOU blocked a background group may set the terminal's
// foreground) and restores its mask after.
//
// PR_SET_PDEATHSIG fires when the *thread* that called spawn_process dies: call it from a thread that lives
// as long as the child.
//
// Errors: throws std::system_error "<who>: <step> of '<path>'" (step: execve, setpgid, ...) with its errno;
// the failed child has been reaped then. `path` must be a path (no PATH lookup: see find_program).
// Threads: any thread; concurrent calls are safe (each uses its own stack).
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

struct SpawnRequest {
  const char* path = nullptr;   // the program (execve's path)
  char* const* argv = nullptr;  // null-terminated
  char* const* envp = nullptr;  // null-terminated: the COMPLETE environment
  int stdin_fd = -1;            // becomes the child's fd 0; -1: inherit
  int stdout_fd = -1;           // becomes the child's fd 1; -1: inherit
  int stderr_fd = -1;           // becomes the child's fd 2; -1: inherit
  bool new_process_group = true;
  bool take_terminal = false;  // with new_process_group: the child's group becomes fd 0's foreground group
  int death_signal = 0;        // PR_SET_PDEATHSIG; 0: none
  int cgroup_fd = -1;          // a cgroup v2 directory to start the child in; -1: the agent's cgroup
  int cgroup_procs_fd = -1;    // its cgroup.procs, written by the child where CLONE_INTO_CGROUP is missing
  const cpu_set_t* affinity = nullptr;  // nullptr: inherit the agent's CPU set
  int fd3 = -1;                         // becomes the child's fd 3 (no close-on-exec); -1: none
};

// argv and envp for a SpawnRequest, built from strings (they live as long as this object).
class ExecStrings {
 public:
  ExecStrings(std::vector<std::string> argv, const std::map<std::string, std::string>& env);
  char* const* argv() { return argv_ptrs_.data(); }
  char* const* envp() { return env_ptrs_.data(); }

 private:
  std::vector<std::string> argv_, env_;
  std::vector<char*> argv_ptrs_, env_ptrs_;
};

// A cpu_set_t of `cpus`; throws std::invalid_argument naming a CPU number outside [0, CPU_SETSIZE).
cpu_set_t cpu_set_of(const std::vector<int>& cpus);

struct SpawnedProcess {
  pid_t pid = -1;
  UniqueFd pidfd;  // readable once the process has exited
};

// `who` starts every error message (e.g. "cannot start local_rank 3").
SpawnedProcess spawn_process(const SpawnRequest& request, const std::string& who);

// Whether a child of this process can be started in the cgroup v2 directory `cgroup_fd` (CLONE_INTO_CGROUP)
// or, on kernels without it, join it through `procs_fd`: starts such a child, which exits at once. Blocks
// until it has been reaped.
bool child_can_join_cgroup(int cgroup_fd, int procs_fd);

}  // namespace ddprun::agent
