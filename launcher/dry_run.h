// --dry-run: what ddprun would start on this node, computed by the code that launches, and nothing else.
//
// make_plan() hands agent::worker_launches() - what the agent spawns in each round - the AgentConfig of
// launcher/agent_config.h, a synthetic first round (rdzv::RendezvousInfo) and the log paths of
// agent::LogLayout::worker() in a placeholder run directory. format_plan() prints the result; where each
// worker's stdout and stderr go is read from its agent::WorkerLaunch. What only the run decides is shown as a
// placeholder:
//   - the random part of the run directory: <log_dir>/<run_id>_XXXXXXXX (agent/log_layout.h), or, without
//     --log_dir, <temp dir>/ddprun-<run_id>-XXXXXX (the agent's temporary directory, removed on success);
//   - MASTER_PORT "<chosen when the store binds>" (--standalone, or port 0) or "<probed among P,...>"
//     (Slurm, no port given);
//   - with c10d, the agent's pid in the console prefix ("[host:<pid>:default0]:");
//   - "<decided at the rendezvous>": with c10d, the node rank, global ranks, world sizes and the workers'
//     store (MASTER_ADDR, MASTER_PORT); with a static backend of several nodes, the world size and, off node
//     0, the global ranks (they add up the other nodes' --nproc_per_node).
//
// Pure: no I/O, no state; thread-safe. Nothing throws except std::bad_alloc.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "agent/process/worker_launch.h"
#include "launcher/agent_config.h"
#include "launcher/launch_config.h"
#include "launcher/rendezvous_options.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::launcher {

// Placeholders for values only the run decides (see the top of this file).
inline constexpr const char* kDecidedAtRendezvous = "<decided at the rendezvous>";
inline constexpr const char* kChosenAtBind = "<chosen when the store binds>";

// What this node would start.
struct Plan {
  std::string store;              // "host:port" of the store (c10d: of the rendezvous), placeholders included
  std::filesystem::path run_dir;  // the log run directory, with its random part as XXXX...
  bool run_dir_temporary = false;  // the agent removes it when the job succeeds (no log directory given)
  std::map<std::string, std::string> pending;  // variable -> placeholder printed instead of its value
  rdzv::RendezvousInfo round;  // the first round as this node would see it, where known (else see pending)
  std::vector<agent::WorkerLaunch> workers;  // index = local rank; from agent::worker_launches
  // The handler's options, as a launch makes them (launcher/rendezvous_options.h): the timeouts and etcd
  // members shown come from them.
  RendezvousOptions rendezvous;
};

// The run directory the agent will create, its random part written as X's: <a.log_dir>/<run_id>_XXXXXXXX,
// or <temp_dir>/ddprun-<run_id>-XXXXXX when a.log_dir is empty.
std::filesystem::path placeholder_run_dir(const agent::AgentConfig& a, const std::string& run_id,
                                          const std::filesystem::path& temp_dir);

// The plan of `c`'s first round, for the agent configuration `a` (agent_config(c, ...)); temp_dir: where the
// agent would create its temporary log directory.
Plan make_plan(const LaunchConfig& c, const agent::AgentConfig& a, const std::filesystem::path& temp_dir);

// A header block (rendezvous, timeouts, nodes, workers, signals, logs, Slurm) and one block per worker: its
// global rank, argv (shell-quoted), where its stdout and stderr go ("console (prefix [default0]:)",
// "file PATH", both joined by " + ", or "discarded"), and its environment sorted by name, restricted to
// is_plan_env_var() names, with the plan's placeholders. Every line ends with '\n'.
std::string format_plan(const LaunchConfig& config, const Plan& plan);

// The whole --dry-run text: format_plan(c, make_plan(c, agent_config(c, context), context.temp_dir)).
std::string dry_run(const LaunchConfig& c, const LauncherContext& context);

// The Slurm block of the plan: mode, job step, who hosts the store, the probed ports, and each derived
// setting with the variable it came from ("    --nnodes 2  <- SLURM_STEP_NUM_NODES=2"). Every line ends with
// '\n'.
std::string format_slurm_launch(const SlurmLaunch& slurm);

// True for the variables ddprun/torchrun set or that shape a worker: RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK,
// ROLE_NAME, LOCAL_WORLD_SIZE, WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, and names starting with TORCHELASTIC_, TORCH_NCCL_, DDPRUN_ or
// NCCL_.
bool is_plan_env_var(std::string_view name);

// `arg` quoted for a POSIX shell when needed: plain words unchanged, otherwise in single quotes ('' -> '\'').
std::string shell_quote(std::string_view arg);

}  // namespace ddprun::launcher
