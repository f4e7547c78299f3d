#include "agent/worker_launches.h"

#include <utility>

#include "agent/worker_env.h"

namespace ddprun::agent {

std::vector<WorkerLaunch> worker_launches(const AgentConfig& config, const rdzv::RendezvousInfo& info,
                                          const std::vector<WorkerLogPaths>& paths,
                                          const std::vector<int>& ranks, const std::string& run_id) {
  const int nproc = static_cast<int>(config.workers.size());
  std::vector<WorkerLaunch> out;
  for (int lr = 0; lr < nproc; ++lr) {
    const auto& p = paths[static_cast<size_t>(lr)];
    const WorkerOutput& o = config.workers[static_cast<size_t>(lr)].output;
    WorkerIdentity who{.local_rank = lr,
                       .rank = ranks[static_cast<size_t>(lr)],
                       .local_world_size = nproc,
                       .world_size = 0,
                       .group_rank = info.group_rank,
                       .group_world_size = info.group_world_size,
                       .role = config.role};
    who.world_size = info.world_size;
    RoundEnv env{.master_addr = info.store_host,
                 .master_port = info.store_port,
                 // Every round is a new attempt for the workers (fresh "/worker/attempt_<n>" keys), also
                 // after a membership change that does not count against max_restarts.
                 .restart_count = info.round,
                 .max_restarts = config.max_restarts,
                 .run_id = run_id,
                 .use_agent_store = true,
                 .error_file = p.error_file.string()};
    WorkerLaunch w;
    w.local_rank = lr;
    w.argv = config.workers[static_cast<size_t>(lr)].argv;
    w.env = worker_env(config.base_env, who, env, config.set_omp_threads);
    if (o.stdout_to_file) w.stdout_file = p.stdout_file;
    // stderr always goes to its log file as well, so a failure can quote its last lines.
    w.stderr_file = p.stderr_file;
    w.console_stdout = o.stdout_to_console;
    w.whole_lines = nproc > 1;  // several workers share the console: never interleave half lines
    w.console_stderr = o.stderr_to_console;
    if (o.prefix_console) {
      w.prefix = "[" + (config.node_tag.empty() ? "" : config.node_tag + ":") + config.role +
                 std::to_string(lr) + "]:";
    }
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace ddprun::agent
