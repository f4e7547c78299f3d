// Slurm: what ddprun derives from the environment srun gives each task (`srun ddprun --nproc_per_node=G
// ...`).
//
// Canonical layout: one srun task per node (srun --ntasks-per-node=1), each running one ddprun agent that
// starts G workers. Derived (docs/slurm.md has the table):
//   nnodes      SLURM_STEP_NUM_NODES (else SLURM_NNODES)
//   node rank   SLURM_NODEID
//   master      the first host of SLURM_STEP_NODELIST (else SLURM_NODELIST, SLURM_JOB_NODELIST)
//   rdzv_id     SLURM_JOB_ID
//   port        slurm_port_candidates(SLURM_JOB_ID): probed in that order (launcher/slurm/slurm_port.h)
// Alternative layout: several tasks per node with --nproc_per_node=1 (one worker per task): every task is an
// agent, nnodes = SLURM_STEP_NUM_TASKS, node rank = SLURM_PROCID; task 0 must run on the first host.
//
// Refused, with a message naming the variables and what to do: not inside a job (no SLURM_JOB_ID); the batch
// script of a multi-node job without srun (SLURM_STEP_ID unset: the other nodes would never join); several
// tasks per node with --nproc_per_node > 1; variables that contradict each other (node count vs. nodelist vs.
// SLURM_STEP_TASKS_PER_NODE vs. task count, SLURM_NODEID or SLURM_PROCID out of range, a step larger than
// its job, task 0 not on the first host); a malformed hostlist or job id.
//
// Pure: reads only the map it is given; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher {

// The store key agent 0 sets to SlurmSettings::step_token once its store listens; other agents accept a
// candidate port only when this key holds their own token.
inline constexpr const char* kSlurmStepKey = "ddprun/slurm-step";

// One derived setting, for --dry-run: {"--nnodes", "2", "SLURM_STEP_NUM_NODES=2"}.
struct SlurmDerived {
  std::string setting, value, source;
  bool operator==(const SlurmDerived&) const = default;
};

struct SlurmSettings {
  std::string job_id;       // SLURM_JOB_ID (digits)
  std::string step_token;   // "<job>.<step>" (+ ".r<SLURM_RESTART_COUNT>" after a requeue): this step's store
  int nnodes = 1;           // agents in the step: nodes, or tasks in task mode
  int node_rank = 0;        // this agent's rank among them
  bool task_mode = false;   // one agent per task (several tasks on a node, --nproc_per_node=1)
  bool batch_step = false;  // run in the batch script of a one-node job (no srun step)
  std::string first_host;   // host of agent 0: the first host of the step's nodelist
  std::vector<uint16_t> ports;        // candidate store ports, in probing order
  std::vector<SlurmDerived> derived;  // --nnodes, --node_rank, --master_addr, --rdzv_id, --master_port
};

// True when SLURM_JOB_ID and SLURM_PROCID are both set and non-empty (the condition for auto-detection).
bool slurm_detected(const std::map<std::string, std::string>& env);

// Derives the settings for an agent that will start `nproc_per_node` workers. On error returns nullopt and
// sets `error` to one sentence (without a "ddprun: " prefix) naming the variables and the remedy.
std::optional<SlurmSettings> derive_slurm(const std::map<std::string, std::string>& env, int nproc_per_node,
                                          std::string& error);

// The store ports tried for job `job_id`, in order: 20000 + (job_id + 1009 k) mod 10000 for k = 0..7 - below
// Linux's ephemeral range (32768+), distinct, the same on every node, and different for consecutive job ids.
std::vector<uint16_t> slurm_port_candidates(uint64_t job_id);

// "23017,24026,..." for messages.
std::string format_ports(const std::vector<uint16_t>& ports);

}  // namespace ddprun::launcher
