#include "agent/worker_env.h"

#include <numeric>
#include <stdexcept>

extern char** environ;

namespace ddprun::agent {

RankAssignment assign_ranks(const std::vector<int>& local_world_sizes, int group_rank) {
  if (group_rank < 0 || static_cast<size_t>(group_rank) >= local_world_sizes.size()) {
    throw std::out_of_range("group rank " + std::to_string(group_rank) + " outside 0.." +
                            std::to_string(local_world_sizes.size()));
  }
  RankAssignment a;
  a.base_rank = std::accumulate(local_world_sizes.begin(), local_world_sizes.begin() + group_rank, 0);
  a.world_size = std::accumulate(local_world_sizes.begin(), local_world_sizes.end(), 0);
  return a;
}

Env worker_env(const Env& base, const WorkerIdentity& who, const RoundEnv& round, bool set_omp_threads) {
  Env env = base;
  auto put = [&](const char* k, const std::string& v) { env[k] = v; };
  auto put_int = [&](const char* k, int v) { env[k] = std::to_string(v); };
  put_int("LOCAL_RANK", who.local_rank);
  put_int("RANK", who.rank);
  put_int("GROUP_RANK", who.group_rank);
  put_int("ROLE_RANK", who.rank);
  put("ROLE_NAME", who.role);
  put_int("LOCAL_WORLD_SIZE", who.local_world_size);
  put_int("WORLD_SIZE", who.world_size);
  put_int("GROUP_WORLD_SIZE", who.group_world_size);
  put_int("ROLE_WORLD_SIZE", who.world_size);
  put("MASTER_ADDR", round.master_addr);
  put_int("MASTER_PORT", round.master_port);
  put_int("TORCHELASTIC_RESTART_COUNT", round.restart_count);
  put_int("TORCHELASTIC_MAX_RESTARTS", round.max_restarts);
  put("TORCHELASTIC_RUN_ID", round.run_id);
  put("TORCHELASTIC_USE_AGENT_STORE", round.use_agent_store ? "True" : "False");
  if (!round.error_file.empty()) put("TORCHELASTIC_ERROR_FILE", round.error_file);
  env.try_emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  env.try_emplace("NCCL_ASYNC_ERROR_HANDLING", "1");
  if (set_omp_threads) env.try_emplace("OMP_NUM_THREADS", "1");
  return env;
}

Env current_environment() {
  Env env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

const std::vector<std::string>& contract_variables() {
  static const std::vector<std::string> kNames = {
      "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
      "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
      "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
      "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING",
      "OMP_NUM_THREADS"};
  return kNames;
}

}  // namespace ddprun::agent
