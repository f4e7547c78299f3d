// The environment contract between the agent and its workers: torchrun's variables (listed in
// docs/migrating-from-torchrun.md).
//
// Pure functions: given who a worker is and the round it runs in, compute its complete environment.
// Workers inherit the agent's whole environment; the contract variables are set on top of it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::agent {

using Env = std::map<std::string, std::string>;

struct WorkerIdentity {
  int local_rank = 0;
  int rank = 0;
  int local_world_size = 1;
  int world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  std::string role = "default";
};

struct RoundEnv {
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id = "none";
  bool use_agent_store = true;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE ("" = not set)
  // torch >= 2.2 reads TORCH_NCCL_ASYNC_ERROR_HANDLING (and warns about the old name), torch < 2.2
  // NCCL_ASYNC_ERROR_HANDLING; torchrun sets its own torch's to "1" when unset.
  std::string nccl_async_error_handling_var = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
};

// `base` is the agent's environment. OMP_NUM_THREADS=1 is added when `set_omp_threads` (the caller decides:
// unset in base and more than one local worker); round.nccl_async_error_handling_var defaults to "1" when
// unset.
Env worker_env(const Env& base, const WorkerIdentity& who, const RoundEnv& round, bool set_omp_threads);

// torchrun's --virtual-local-rank: the device worker `local_rank` sees as its only one. With
// CUDA_VISIBLE_DEVICES set in `base`, its local_rank-th comma-separated entry, spaces trimmed (nullopt when
// the list is shorter: torch refuses to start); unset, the local rank itself.
std::optional<std::string> virtual_device(const Env& base, int local_rank);

// Applies --virtual-local-rank to a worker's environment `env` (made by worker_env from `base`), as torch
// does: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES=virtual_device(base, local_rank). Precondition: that device
// exists (the launcher refused the command line otherwise); else CUDA_VISIBLE_DEVICES is left as it is.
void apply_virtual_local_rank(const Env& base, int local_rank, Env& env);

// The process environment as a map.
Env current_environment();

}  // namespace ddprun::agent
