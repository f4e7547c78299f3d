// The node's health, checked before every join of a round (AgentLoop::rendezvous): may this node's workers
// run here now? Built-in checks (cheap: a few ms without GPUs, NVML's calls with them):
//   - --log_dir is writable and has HealthPolicy::log_dir_min_free bytes free;
//   - /dev/shm has room for the worker SDK's segment of this many local ranks (rendezvous/util/shm_layout.h,
//     with $DDPRUN_SHM_SLOT_BYTES) when there is more than one and DDPRUN_CPU_TRANSPORT is not tcp;
//   - each GPU the local ranks will use opens through NVML, its memory reads, and it has no failed or pending
//     row remapping (agent/health/nvml.h; skipped without libnvidia-ml). Local rank i uses the i-th entry of
//     CUDA_VISIBLE_DEVICES, else GPU i; GPUs beyond what NVML counts are skipped unless CUDA_VISIBLE_DEVICES
//     names them (a CPU job on a machine with fewer GPUs than ranks).
// then the user's --health_check command: /bin/sh -c CMD with the workers' base environment plus
// DDPRUN_HEALTH_GPUS (the GPUs above, comma-separated) and LOCAL_WORLD_SIZE; healthy when it exits 0 within
// its timeout, its output goes to the agent's log.
//
// Threads: the agent's loop thread. Never throws except std::bad_alloc.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/health/nvml.h"

namespace ddprun::agent {

struct HealthReport {
  std::vector<std::string> problems;  // empty: healthy
  std::chrono::milliseconds elapsed{0};
  bool healthy() const { return problems.empty(); }
  std::string summary() const;  // the problems, "; "-separated
};

// The GPUs local ranks 0..local_world_size-1 use: the entries of CUDA_VISIBLE_DEVICES (`listed`), else GPU
// indices 0..n-1.
struct NodeGpus {
  std::vector<std::string> ids;
  bool listed = false;
};
NodeGpus node_gpus(const Env& env, int local_world_size);

// "" when `dir` has `need` bytes free; else what is wrong ("<what> <dir> has 12 MiB free, 64 MiB needed").
std::string room_problem(const std::string& what, const std::string& dir, uint64_t need);

// Every check, built-in first; `nvml` may be null (no GPU check).
HealthReport check_health(const AgentConfig& config, Nvml* nvml);

}  // namespace ddprun::agent
