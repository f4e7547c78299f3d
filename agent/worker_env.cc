#include "agent/worker_env.h"

#include "rendezvous/util/text_util.h"

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
  env.try_emplace(round.nccl_async_error_handling_var, "1");
  if (set_omp_threads) env.try_emplace("OMP_NUM_THREADS", "1");
  return env;
}

std::optional<std::string> virtual_device(const Env& base, int local_rank) {
  auto it = base.find("CUDA_VISIBLE_DEVICES");
  if (it == base.end()) return std::to_string(local_rank);
  const auto devices = split(it->second, ',');
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= devices.size()) return std::nullopt;
  std::string device = devices[static_cast<size_t>(local_rank)];
  device.erase(0, device.find_first_not_of(" \t\n\r\f\v"));
  device.erase(device.find_last_not_of(" \t\n\r\f\v") + 1);
  return device;
}

void apply_virtual_local_rank(const Env& base, int local_rank, Env& env) {
  env["LOCAL_RANK"] = "0";
  if (auto device = virtual_device(base, local_rank)) env["CUDA_VISIBLE_DEVICES"] = *device;
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
