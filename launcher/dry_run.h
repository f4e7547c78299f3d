// --dry-run: a human-readable description of what ddprun would start, and nothing else.
//
// The launcher computes a Plan (ranks, argv and environment of each local worker, the store address) exactly
// as it would for a real launch, then prints format_plan() instead of spawning. Pure formatting: no I/O, no
// state, thread-safe.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/launch_config.h"

namespace ddprun::launcher {

// One local worker as it would be started.
struct PlanWorker {
  int local_rank = 0, rank = 0;
  std::vector<std::string> argv;           // as for execvp: argv[0] is the program
  std::map<std::string, std::string> env;  // the full worker environment (filtered when printed)
};

// What this node would do. world_size is the group's total number of workers (WORLD_SIZE).
struct Plan {
  std::string store_endpoint;  // "host:port" of the rendezvous/agent store
  int node_rank = 0, nnodes = 1, world_size = 1;
  std::vector<PlanWorker> workers;
};

// A header block (rendezvous, nodes, restarts, signals, logs) and one block per worker: argv (shell-quoted),
// where its stdout/stderr go, and its environment sorted by name, restricted to is_plan_env_var() names.
// Every line ends with '\n'.
std::string format_plan(const LaunchConfig& config, const Plan& plan);

// The Slurm block of the plan: mode, job step, who hosts the store, the probed ports, and each derived setting
// with the variable it came from ("    --nnodes 2  <- SLURM_STEP_NUM_NODES=2"). Every line ends with '\n'.
std::string format_slurm_launch(const SlurmLaunch& slurm);

// True for the variables ddprun/torchrun set or that shape a worker: RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK,
// ROLE_NAME, LOCAL_WORLD_SIZE, WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, and names starting with TORCHELASTIC_, TORCH_NCCL_, DDPRUN_ or
// NCCL_.
bool is_plan_env_var(std::string_view name);

// `arg` quoted for a POSIX shell when needed: plain words unchanged, otherwise in single quotes ('' -> '\'').
std::string shell_quote(std::string_view arg);

}  // namespace ddprun::launcher
