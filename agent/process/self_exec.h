// The agent's helper processes (the orphan guard, agent/process/orphan_guard.h; the state guard,
// agent/state/state_guard.h) are the agent's own program run again under another argv[0]: main() hands
// such a start to the helper's entry function before anything else, and each entry calls enable_self_exec()
// when the start is the agent's own (from then on helpers are exec'd).
//
// exec_self() starts /proc/self/exe with `argv` through vfork (no copy of the agent's memory; the agent waits
// only until the exec): `fd0` becomes the child's fd 0, /dev/null its 1 and 2, every other fd is closed, the
// environment is empty; signals stay blocked in the child until the exec (the agent's handlers must not run
// there). Returns the child's pid, or -1 with errno. Thread-safe.
#pragma once

#include <sys/types.h>

namespace ddprun::agent {

// main() calls the helpers' entries first: this records that it did (helpers may be exec'd).
void enable_self_exec();
bool self_exec_enabled();

// In a child about to become a helper (after fork or vfork): only `fd` stays open, as fd 0; 1 and 2 are
// /dev/null. Async-signal-safe.
void keep_only_fd0(int fd);

pid_t exec_self(int fd0, char* const* argv);

}  // namespace ddprun::agent
