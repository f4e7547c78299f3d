// ddprun: the per-node launcher, a drop-in for torchrun.
//
//   ddprun [torchrun flags] script.py [script args]
//
// Wiring only: command line -> LaunchConfig (validated) -> rendezvous handler -> ElasticAgent. Exit codes
// (docs/cli.md): 0 success, 2 bad command line, 3 store cannot listen / lost, 4 rendezvous failed, 5 a worker
// could not be started, else the first failing worker's exit code (128+N for signal N); under Slurm 75 when
// SIGTERM/SIGUSR1/SIGUSR2 stopped the job.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "agent/elastic_agent.h"
#include "agent/exit_codes.h"
#include "agent/worker_env.h"
#include "launcher/dry_run.h"
#include "launcher/flag_values.h"
#include "launcher/launch_config.h"
#include "launcher/slurm_port.h"
#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/static_rendezvous.h"

namespace {

using ddprun::launcher::LaunchConfig;
using ddprun::launcher::Std;

std::string host_tag() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string h(host);
  return h.substr(0, h.find('.')) + ":" + std::to_string(getpid());
}

bool has(Std value, Std bit) {
  return (static_cast<int>(value) & static_cast<int>(bit)) != 0;
}

std::chrono::milliseconds seconds(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
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
  a.hang_timeout = seconds(c.hang_timeout);
  a.signals_to_handle = c.signals_to_handle;
  if (c.slurm) {  // scancel, preemption, time limit, srun --signal: incomplete, may be requeued
    for (int sig : {SIGTERM, SIGUSR1, SIGUSR2}) {
      a.signal_exit_codes[sig] = ddprun::agent::kExitSlurmInterrupted;
    }
  }
  a.log_dir = c.log_dir;
  if (a.log_dir.empty() && temp_logs_needed) a.log_dir = std::filesystem::temp_directory_path();
  if (c.is_elastic() && !c.standalone) {
    a.node_tag = host_tag();
  } else if (c.max_nodes > 1) {
    a.node_tag = "n" + std::to_string(c.node_rank);
  }
  for (int lr = 0; lr < c.nproc_per_node; ++lr) {
    Std redirect = c.redirects.for_rank(lr);
    Std tee = c.tee.for_rank(lr);
    bool shown = !c.local_ranks_filter || c.local_ranks_filter->count(lr);
    ddprun::agent::WorkerOutput o;
    o.stdout_to_file = has(redirect, Std::kOut) || has(tee, Std::kOut);
    o.stderr_to_file = has(redirect, Std::kErr) || has(tee, Std::kErr);
    o.stdout_to_console = shown && (!has(redirect, Std::kOut) || has(tee, Std::kOut));
    o.stderr_to_console = shown && (!has(redirect, Std::kErr) || has(tee, Std::kErr));
    o.prefix_console = tee != Std::kNone || c.local_ranks_filter.has_value() || c.max_nodes > 1;
    a.workers.push_back({.argv = c.worker_argv(lr), .output = o});
  }
  return a;
}

std::unique_ptr<ddprun::rdzv::RendezvousHandler> make_rendezvous(const LaunchConfig& c) {
  if (c.is_elastic() && !c.standalone) {
    ddprun::rdzv::DynamicRendezvousOptions o;
    o.run_id = c.rdzv_id;
    o.min_nodes = c.min_nodes;
    o.max_nodes = c.max_nodes;
    std::string error;
    auto ep =
        ddprun::rdzv::parse_endpoint(c.rdzv_endpoint.empty() ? "localhost" : c.rdzv_endpoint, 29400, error);
    if (!ep) throw ddprun::rdzv::InvalidArgumentError(error);  // validated by the CLI layer already
    o.endpoint_host = ep->host;
    o.endpoint_port = ep->port;
    if (auto it = c.rdzv_conf.find("is_host"); it != c.rdzv_conf.end()) o.is_host = it->second == "true";
    const auto t = ddprun::launcher::rdzv_timings(c.rdzv_conf);
    o.join_timeout = seconds(t.join_timeout);
    o.last_call_timeout = seconds(t.last_call_timeout);
    o.close_timeout = seconds(t.close_timeout);
    o.keep_alive_interval = seconds(t.keep_alive_interval);
    o.keep_alive_max_attempt = t.keep_alive_max_attempt;
    o.read_timeout = seconds(t.read_timeout);
    return std::make_unique<ddprun::rdzv::DynamicRendezvous>(o);
  }
  ddprun::rdzv::StaticRendezvousOptions ro;
  ro.run_id = c.rdzv_id;
  ro.node_rank = c.node_rank;
  ro.nnodes = c.max_nodes;
  ro.master_addr = c.master_addr;
  ro.master_port = c.master_port;
  ro.host_store = c.node_rank == 0;
  ro.join_timeout = seconds(ddprun::launcher::rdzv_timings(c.rdzv_conf).join_timeout);
  ro.connect_timeout = ro.join_timeout;
  if (c.standalone) {
    ro.master_addr = "127.0.0.1";
    ro.master_port = 0;
    ro.bind_host = "127.0.0.1";
    ro.host_store = true;
  }
  return std::make_unique<ddprun::rdzv::StaticRendezvous>(ro);
}

// make_rendezvous, except under Slurm without a port given: then on the first free candidate port (agent 0),
// or on the candidate whose store belongs to this Slurm step (the other agents). See launcher/slurm_port.h.
std::unique_ptr<ddprun::rdzv::RendezvousHandler> make_rendezvous_on_port(const LaunchConfig& c) {
  if (!c.slurm || c.slurm->probe_ports.empty()) return make_rendezvous(c);
  const ddprun::launcher::SlurmLaunch& s = *c.slurm;
  auto at = [&c, &s](uint16_t port) {
    LaunchConfig on_port = c;
    if (c.rdzv_backend == "c10d") {
      on_port.rdzv_endpoint = ddprun::rdzv::format_endpoint(s.store_host, port);
    } else {
      on_port.master_port = port;
    }
    return make_rendezvous(on_port);
  };
  const std::string& token = s.settings.step_token;
  if (s.hosts_store) {
    return ddprun::launcher::host_on_first_free_port(s.store_host, s.probe_ports, token, at).rendezvous;
  }
  auto timeout = seconds(ddprun::launcher::rdzv_timings(c.rdzv_conf).join_timeout);
  return at(ddprun::launcher::find_step_store(s.store_host, s.probe_ports, token, timeout));
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
    plan.workers.push_back({lr, who.rank, a.workers[static_cast<size_t>(lr)].argv,
                            ddprun::agent::worker_env(a.base_env, who, round, a.set_omp_threads)});
  }
  std::cout << ddprun::launcher::format_plan(c, plan);
  return 0;
}

}  // namespace

namespace {

// The whole launcher; main() only guards it.
int run_launcher(int argc, char** argv) {
  LaunchConfig config;
  std::vector<std::string> args(argv, argv + argc);
  auto parsed = ddprun::launcher::parse_launch_config(args, ddprun::agent::current_environment(), {}, config);
  if (parsed.should_exit) {
    (parsed.exit_code == 0 ? std::cout : std::cerr)
        << parsed.message << (parsed.message.ends_with('\n') ? "" : "\n");
    return parsed.exit_code;
  }
  if (!parsed.message.empty()) std::cerr << parsed.message << (parsed.message.ends_with('\n') ? "" : "\n");

  // Like torchrun, the agent's own messages go to stderr; stdout carries the workers' output only.
  spdlog::set_default_logger(spdlog::stderr_color_mt("ddprun"));
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  // Elastic node ranks are known only after the rendezvous: tag those agents by host and pid instead.
  std::string tag = config.is_elastic() && !config.standalone ? "ddprun " + host_tag()
                    : config.max_nodes > 1                    ? "ddprun n" + std::to_string(config.node_rank)
                                                              : "ddprun";
  spdlog::set_pattern("[%H:%M:%S.%e] " + tag + " %l: %v");

  bool temp_logs =
      config.redirects != ddprun::launcher::StdSpec{} || config.tee != ddprun::launcher::StdSpec{};
  auto agent_cfg = agent_config(config, temp_logs);
  if (config.dry_run) return print_plan(config, agent_cfg);
  if (agent_cfg.set_omp_threads) {
    std::cerr << "ddprun: setting OMP_NUM_THREADS=1 for each worker to avoid overloading the machine; set it "
                 "yourself to tune\n";
  }

  std::unique_ptr<ddprun::rdzv::RendezvousHandler> rdzv;
  try {
    rdzv = make_rendezvous_on_port(config);
  } catch (const ddprun::rdzv::BindError& e) {
    spdlog::error("{}; use another port (--master_port / --rdzv_endpoint), or --standalone on a single node",
                  e.what());
    return ddprun::agent::kExitStoreFailed;
  } catch (const ddprun::rdzv::StoreError& e) {
    spdlog::error("{}", e.what());
    return ddprun::agent::kExitRendezvousFailed;
  }
  ddprun::agent::ElasticAgent agent(std::move(agent_cfg), std::move(rdzv));
  return agent.run();
}
}  // namespace

int main(int argc, char** argv) {
  // Anything that escapes is a bug of ddprun, not of the job: say so and exit 1 (docs/cli.md). By then the
  // agent's destructors have stopped and reaped every worker.
  try {
    return run_launcher(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "ddprun: internal error (unknown exception)\n");
  }
  return 1;
}
