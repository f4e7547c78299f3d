#include "agent/worker_env.h"

extern char** environ;

namespace ddprun::agent {

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

}  // namespace ddprun::agent
