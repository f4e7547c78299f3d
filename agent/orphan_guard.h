// OrphanGuard: a tiny guardian process that kills the workers' process groups when the agent dies without
// cleaning up (SIGKILL, the OOM killer).
//
// PR_SET_PDEATHSIG already kills each worker with the agent, but not what the workers started: their
// children stay in the worker's process group and would be orphaned. The guardian is forked at
// construction, in a process group of its own, ignoring every catchable signal, holding nothing but the read
// end of a pipe from the agent. The agent reports each worker's process group as it is spawned (watch) and
// reaped (forget). End of file on the pipe without a prior "quit" means the agent is gone: the guardian
// SIGKILLs every group it still knows, then exits. A clean destruction sends "quit" and reaps the guardian.
//
// Threads: watch/forget may be called from any one thread at a time (each is one write of 8 bytes, atomic
// on a pipe). Errors: the constructor throws std::system_error when pipe or fork fails; a guardian that
// died on its own is reported once (log) and the agent carries on without it.
#pragma once

#include <sys/types.h>

namespace ddprun::agent {

class OrphanGuard {
 public:
  OrphanGuard();
  ~OrphanGuard();
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  void watch(pid_t pgid);
  void forget(pid_t pgid);

 private:
  void send(int op, pid_t pgid);

  int fd_ = -1;  // write end of the pipe
  pid_t pid_ = -1;
  bool broken_ = false;
};

}  // namespace ddprun::agent
