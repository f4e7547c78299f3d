// ddprun: the per-node launcher, a drop-in for torchrun.
//
//   ddprun [torchrun flags] script.py [script args]
//
// Wiring only: command line -> LaunchConfig (validated) -> rendezvous handler -> ElasticAgent. Exit codes
// (docs/cli.md): 0 success, 2 bad command line, 3 store cannot listen / lost, 4 rendezvous failed, 5 a worker
// could not be started, else the first failing worker's exit code (128+N for signal N).
#include <cstdio>
#include <iostream>
#include <thread>

#include <spdlog/spdlog.h>

#include "agent/elastic_agent.h"
#include "agent/worker_env.h"
#include "launcher/dry_run.h"
#include "launcher/launch_config.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/static_rendezvous.h"

namespace {

using ddprun::launcher::LaunchConfig;
using ddprun::launcher::Std;

bool has(Std value, Std bit) { return (static_cast<int>(value) & static_cast<int>(bit)) != 0; }

std::chrono::milliseconds seconds(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

double conf_seconds(const LaunchConfig& c, const std::string& key, double fallback) {
  auto it = c.rdzv_conf.find(key);
  return it == c.rdzv_conf.end() ? fallback : std::stod(it->second);
}

ddprun::agent::AgentConfig agent_config(const LaunchConfig& c, bool temp_logs_needed) {
  ddprun::agent::AgentConfig a;
  a.role = c.role;
  a.script_name = c.training_script;
  a.base_env = ddprun::agent::current_environment();
  a.set_omp_threads = c.nproc_per_node > 1 && !a.base_env.count("OMP_NUM_THREADS");
  a.max_restarts = c.max_restarts;
  a.shutdown_grace = seconds(c.shutdown_timeout);
  a.exit_barrier_timeout = seconds(c.exit_barrier_timeout);
  a.signals_to_handle = c.signals_to_handle;
  a.log_dir = c.log_dir;
  if (a.log_dir.empty() && temp_logs_needed) a.log_dir = std::filesystem::temp_directory_path();
  if (c.max_nodes > 1) a.node_tag = "n" + std::to_string(c.node_rank);
  for (int lr = 0; lr < c.nproc_per_node; ++lr) {
    a.worker_argv.push_back(c.worker_argv(lr));
    Std redirect = c.redirects.for_rank(lr);
    Std tee = c.tee.for_rank(lr);
    bool shown = !c.local_ranks_filter || c.local_ranks_filter->count(lr);
    ddprun::agent::WorkerOutput o;
    o.stdout_to_file = has(redirect, Std::kOut) || has(tee, Std::kOut);
    o.stderr_to_file = has(redirect, Std::kErr) || has(tee, Std::kErr);
    o.stdout_to_console = shown && (!has(redirect, Std::kOut) || has(tee, Std::kOut));
    o.stderr_to_console = shown && (!has(redirect, Std::kErr) || has(tee, Std::kErr));
    o.prefix_console = tee != Std::kNone || c.local_ranks_filter.has_value() || c.max_nodes > 1;
    a.outputs.push_back(o);
  }
  return a;
}

int print_plan(const LaunchConfig& c, const ddprun::agent::AgentConfig& a) {
  ddprun::launcher::Plan plan;
  plan.store_endpoint = ddprun::rdzv::format_endpoint(c.master_addr, c.master_port);
  plan.node_rank = c.node_rank;
  plan.nnodes = c.max_nodes;
  plan.world_size = c.nproc_per_node * c.max_nodes;  // assumes every node runs --nproc_per_node workers
  for (int lr = 0; lr < c.nproc_per_node; ++lr) {
    ddprun::agent::WorkerIdentity who{.local_rank = lr,
                                      .rank = c.node_rank * c.nproc_per_node + lr,
                                      .local_world_size = c.nproc_per_node,
                                      .world_size = plan.world_size,
                                      .group_rank = c.node_rank,
                                      .group_world_size = c.max_nodes,
                                      .role = c.role};
    ddprun::agent::RoundEnv round{.master_addr = c.master_addr,
                                  .master_port = c.master_port,
                                  .restart_count = 0,
                                  .max_restarts = c.max_restarts,
                                  .run_id = c.rdzv_id,
                                  .use_agent_store = true,
                                  .error_file = "<log_dir>/attempt_0/" + std::to_string(lr) + "/error.json"};
    plan.workers.push_back({lr, who.rank, a.worker_argv[static_cast<size_t>(lr)],
                            ddprun::agent::worker_env(a.base_env, who, round, a.set_omp_threads)});
  }
  std::cout << ddprun::launcher::format_plan(c, plan);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  LaunchConfig config;
  std::vector<std::string> args(argv, argv + argc);
  auto parsed = ddprun::launcher::parse_launch_config(args, ddprun::agent::current_environment(), {}, config);
  if (parsed.should_exit) {
    (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << (parsed.message.ends_with('\n') ? "" : "\n");
    return parsed.exit_code;
  }
  if (!parsed.message.empty()) std::cerr << parsed.message << (parsed.message.ends_with('\n') ? "" : "\n");

  spdlog::set_level(spdlog::level::from_str(config.log_level));
  std::string tag = config.max_nodes > 1 ? "ddprun n" + std::to_string(config.node_rank) : "ddprun";
  spdlog::set_pattern("[%H:%M:%S.%e] " + tag + " %l: %v");

  if (config.is_elastic() && !config.standalone) {
    std::cerr << "ddprun: --rdzv_backend c10d and --nnodes MIN:MAX (elastic rendezvous) are not available in this "
                 "version; use a fixed --nnodes N with --node_rank/--master_addr/--master_port (static)\n";
    return ddprun::agent::kExitUsage;
  }
  bool temp_logs = config.redirects != ddprun::launcher::StdSpec{} || config.tee != ddprun::launcher::StdSpec{};
  auto agent_cfg = agent_config(config, temp_logs);
  if (config.dry_run) return print_plan(config, agent_cfg);
  if (agent_cfg.set_omp_threads) {
    std::cerr << "ddprun: setting OMP_NUM_THREADS=1 for each worker to avoid overloading the machine; set it "
                 "yourself to tune\n";
  }

  ddprun::rdzv::StaticRendezvousOptions ro;
  ro.run_id = config.rdzv_id;
  ro.node_rank = config.node_rank;
  ro.nnodes = config.max_nodes;
  ro.master_addr = config.master_addr;
  ro.master_port = config.master_port;
  ro.host_store = config.node_rank == 0;
  ro.join_timeout = seconds(conf_seconds(config, "join_timeout", 600));
  ro.connect_timeout = ro.join_timeout;
  if (config.standalone) {
    ro.master_addr = "127.0.0.1";
    ro.master_port = 0;
    ro.bind_host = "127.0.0.1";
    ro.host_store = true;
  }
  std::unique_ptr<ddprun::rdzv::StaticRendezvous> rdzv;
  try {
    rdzv = std::make_unique<ddprun::rdzv::StaticRendezvous>(ro);
  } catch (const ddprun::rdzv::BindError& e) {
    spdlog::error("{}; use another --master_port, or --standalone on a single node", e.what());
    return ddprun::agent::kExitStoreFailed;
  } catch (const ddprun::rdzv::StoreError& e) {
    spdlog::error("{}", e.what());
    return ddprun::agent::kExitRendezvousFailed;
  }
  ddprun::agent::ElasticAgent agent(std::move(agent_cfg), std::move(rdzv));
  return agent.run();
}
