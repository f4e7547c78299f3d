// OrphanGuard: no process the workers start outlives the agent, however the agent ends (normal exit, error,
// signal, SIGKILL, the OOM killer), and whatever session or process group the process moved to (setsid,
// double fork).
//
// Two ways to find what the workers left, chosen at construction (mode()):
//  - kCgroup: a cgroup v2 of the agent's own holds the workers (agent/process/worker_cgroup.h says where
//    that works). Everything a worker starts stays in it; kill_leftovers() ends it all at once with
//    cgroup.kill.
//  - kSubreaper: otherwise. The agent process becomes a child subreaper (PR_SET_CHILD_SUBREAPER, for the
//    rest of its life), so an orphan of the workers is re-parented to the agent instead of init and stays
//    in the agent's ppid tree; kill_leftovers() SIGKILLs that tree (agent/process/process_tree.h) and reaps
//    the agent's children in it. Such orphans are the agent's children: forget() reaps the ones that exited
//    (zombies whose process group is one that was watched), never a watched pid.
//
// The guard process ("ddprun-guard" in /proc/<pid>/comm and cmdline, its own process group, every catchable
// signal ignored, an empty environment, no fd but a socket to the agent) covers the agent's death without
// cleanup: at end of file on the socket without a prior "quit", it SIGKILLs the watched process groups and
// the cgroup (then removes it). It is the agent's program run again: main() must call guard_entry() first;
// a program that does not (unit tests) gets the guard as a plain fork of itself, named by PR_SET_NAME only.
// When the guard dies (someone killed it), a monitor thread of the agent starts another with the current
// watch list. Limit of kSubreaper: after a SIGKILL of the agent the guard reaches the watched process groups
// only; a descendant that left them (setsid) is re-parented to init and escapes. kCgroup has no such limit.
//
// Contract for the spawn path (ProcessContext):
//  - start the child in cgroup_dir_fd() when >= 0 (spawn.h's SpawnRequest::cgroup_fd; with cgroup_procs_fd()
//    as the fallback for kernels before 5.7, written by the child before exec).
//  - watch(pid) right after the spawn (pid = the worker's process group); forget(pid) after it was reaped.
//    Every child the owner waits for itself must be watched until it is reaped.
//  - kill_leftovers() once the workers are reaped and nothing started by the workers may run any longer (end
//    of a round, close). The destructor calls it too.
//
// Threads: watch, forget and kill_leftovers may be called from any thread (a mutex serialises them and the
// monitor thread). Blocking: watch is one send on a local socket; forget reads /proc in kSubreaper mode;
// kill_leftovers and the destructor block until the leftovers are dead (at most ~10 s for processes stuck
// in uninterruptible sleep; then a warning). Errors: the constructor throws std::system_error when no guard
// process can be started (socketpair, fork); a guard that cannot be restarted is logged, not thrown.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

class WorkerCgroup;

// For main(), first thing: when argv[0] is "ddprun-guard" (the guard started by OrphanGuard), runs the guard
// and returns its exit code; otherwise returns nullopt and from then on guards are started by exec'ing
// /proc/self/exe.
std::optional<int> guard_entry(int argc, char** argv);

class OrphanGuard {
 public:
  enum class Mode { kCgroup, kSubreaper };

  OrphanGuard();
  ~OrphanGuard();
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  Mode mode() const { return cgroup_ ? Mode::kCgroup : Mode::kSubreaper; }
  // The workers' cgroup.procs, open for writing; -1 in kSubreaper mode.
  int cgroup_procs_fd() const;
  // The workers' cgroup directory (for CLONE_INTO_CGROUP); -1 in kSubreaper mode.
  int cgroup_dir_fd() const;
  void watch(pid_t pgid);
  void forget(pid_t pgid);
  void kill_leftovers();
  // The guard process now (it changes when one is restarted).
  pid_t guard_pid() const;

 private:
  void start_guard();             // requires mu_
  void send(int op, pid_t pgid);  // requires mu_
  void monitor();
  void reap_adopted();  // requires mu_

  std::unique_ptr<WorkerCgroup> cgroup_;
  mutable std::mutex mu_;
  std::set<pid_t> watched_;       // guarded by mu_
  std::set<pid_t> ever_watched_;  // guarded by mu_
  pid_t guard_pid_ = -1;          // guarded by mu_
  UniqueFd guard_pidfd_;          // guarded by mu_ (read by the monitor thread without it: set before)
  UniqueFd socket_;               // guarded by mu_
  UniqueFd stop_;                 // eventfd: ends the monitor thread
  std::thread monitor_;
};

}  // namespace ddprun::agent
