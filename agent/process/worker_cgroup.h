// WorkerCgroup: a cgroup v2 of the agent's own that holds every worker and everything the workers start,
// so that all of it can be ended at once (cgroup.kill), whatever session or process group it moved to.
//
// Where it is created: a child "ddprun-<agent pid>" of the agent's own cgroup v2 directory (the "0::" line of
// /proc/self/cgroup under the cgroup2 mount of /proc/self/mountinfo: /sys/fs/cgroup on a unified host,
// /sys/fs/cgroup/unified on a hybrid one). This works where the agent may write there: root outside a
// container, a delegated subtree (systemd Delegate=yes: `systemd-run --user --scope -p Delegate=yes`), a
// container with a writable cgroup namespace. It does not (create() returns nullptr) in an ordinary login
// session or Slurm step of a non-root user (root-owned cgroups), nor in a container whose /sys/fs/cgroup is
// read-only (Docker's and Kubernetes' default). No controller is enabled: the cgroup only groups processes,
// every limit stays the agent's cgroup's.
//
// Joining: a worker is started in it (agent/process/spawn.h: SpawnRequest::cgroup_fd, CLONE_INTO_CGROUP; on
// kernels before 5.7 the child writes "0" to procs_fd() before exec). Its descendants stay in the cgroup for
// good unless they may write to the agent's cgroup (root).
//
// Threads: kill_all may run on any thread; the object must outlive them. Errors: create() returns
// nullptr (and logs why at debug level) when the cgroup cannot be made or joined; nothing else throws.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

// The cgroup v2 path of the "0::" line of /proc/<pid>/cgroup text ("/user.slice/x.scope"), or nullopt when
// there is none (a cgroup v1-only host).
std::optional<std::string> cgroup2_path(std::string_view proc_cgroup);

// The directory of cgroup v2 path `path` given /proc/self/mountinfo text: the mount point of a cgroup2
// mount whose root is `path` or one of its ancestors, followed by the rest of `path`. nullopt when no such
// mount is visible.
std::optional<std::filesystem::path> cgroup2_directory(std::string_view mountinfo, const std::string& path);

class WorkerCgroup {
 public:
  // Creates the cgroup and checks that a child of the agent can be started in it (a probe child that exits
  // at once). nullptr when not possible.
  static std::unique_ptr<WorkerCgroup> create();
  // Kills what is left (kill_all) and removes the directory.
  ~WorkerCgroup();
  WorkerCgroup(const WorkerCgroup&) = delete;
  WorkerCgroup& operator=(const WorkerCgroup&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // cgroup.procs, open for writing (O_CLOEXEC).
  int procs_fd() const { return procs_.get(); }
  // The directory itself, open (O_CLOEXEC): for clone3's CLONE_INTO_CGROUP (agent/process/spawn.h).
  int dir_fd() const { return dir_.get(); }
  // SIGKILLs every process inside (cgroup.kill; on kernels before 5.14, each pid of cgroup.procs until none
  // is left) and waits until the cgroup is empty or `deadline` passes (then false). Blocks.
  bool kill_all(std::chrono::steady_clock::time_point deadline) const;

 private:
  WorkerCgroup(std::filesystem::path path, UniqueFd dir, UniqueFd procs)
      : path_(std::move(path)), dir_(std::move(dir)), procs_(std::move(procs)) {}

  std::filesystem::path path_;
  UniqueFd dir_;
  UniqueFd procs_;
};

// Async-signal-safe pieces, shared with the guard process (agent/process/orphan_guard.cc), which runs them
// after the agent is gone: SIGKILL everything in the cgroup directory `dir` and wait (at most timeout_ms)
// until it is empty; then remove the directory. False when it did not empty in time or could not be removed.
bool kill_cgroup_and_remove(const char* dir, int timeout_ms);

}  // namespace ddprun::agent
