// ddprun: the per-node launcher, a drop-in for torchrun.
//
//   ddprun [torchrun flags] script.py [script args]
//
// Wiring only: command line -> LaunchConfig (validated, typed) -> rendezvous handler -> ElasticAgent, with
// the AgentConfig of launcher/agent_config.h, after launcher/preflight.h's checks; --dry-run prints
// launcher/dry_run.h's plan instead. Exit codes (docs/cli.md): 0 success, 2 bad command line (or a program or
// script that is not there), 3 store cannot listen / lost, 4 rendezvous failed, 5 a worker could not be
// started, 6 hung, else the first failing worker's exit code (128+N for signal N); under Slurm 75 when
// SIGTERM/SIGUSR1/SIGUSR2 stopped the job.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "agent/elastic_agent.h"
#include "agent/exit_codes.h"
#include "agent/process/orphan_guard.h"
#include "agent/worker_env.h"
#include "launcher/agent_config.h"
#include "launcher/dry_run.h"
#include "launcher/launch_config.h"
#include "launcher/preflight.h"
#include "launcher/slurm_port.h"
#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/static_rendezvous.h"
#include "rendezvous/text_util.h"

namespace {

using ddprun::launcher::LaunchConfig;
using ddprun::launcher::millis;
using ddprun::launcher::RendezvousKind;

std::unique_ptr<ddprun::rdzv::RendezvousHandler> make_rendezvous(const LaunchConfig& c) {
  const ddprun::launcher::RdzvTimings& t = c.rdzv_timings;
  if (c.rdzv_kind == RendezvousKind::kC10d) {
    ddprun::rdzv::DynamicRendezvousOptions o;
    o.run_id = c.rdzv_id;
    o.min_nodes = c.min_nodes;
    o.max_nodes = c.max_nodes;
    o.endpoint_host = c.rdzv_endpoint.host;
    o.endpoint_port = c.rdzv_endpoint.port;
    o.is_host = c.is_host;
    o.join_timeout = millis(t.join_timeout);
    o.last_call_timeout = millis(t.last_call_timeout);
    o.close_timeout = millis(t.close_timeout);
    o.keep_alive_interval = millis(t.keep_alive_interval);
    o.keep_alive_max_attempt = t.keep_alive_max_attempt;
    o.read_timeout = millis(t.read_timeout);
    o.fallback_endpoints = c.rdzv_fallbacks;
    o.failover = c.store_failover;
    o.local_addr = c.local_addr;
    o.store_memory_budget = c.store_memory_budget;
    return std::make_unique<ddprun::rdzv::DynamicRendezvous>(o);
  }
  const bool standalone = c.rdzv_kind == RendezvousKind::kStandalone;
  ddprun::rdzv::StaticRendezvousOptions o;
  o.run_id = c.rdzv_id;
  o.node_rank = standalone ? 0 : c.node_rank;
  o.nnodes = c.max_nodes;
  o.master_addr = c.rdzv_endpoint.host;
  o.master_port = c.rdzv_endpoint.port;
  o.host_store = o.node_rank == 0;
  if (standalone) o.bind_host = c.rdzv_endpoint.host;
  o.store_memory_budget = c.store_memory_budget;
  o.join_timeout = millis(t.join_timeout);
  o.connect_timeout = o.join_timeout;
  return std::make_unique<ddprun::rdzv::StaticRendezvous>(o);
}

// make_rendezvous, except under Slurm without a port given: then on the first free candidate port (agent 0),
// or on the candidate whose store belongs to this Slurm step (the other agents). See launcher/slurm_port.h.
std::unique_ptr<ddprun::rdzv::RendezvousHandler> make_rendezvous_on_port(const LaunchConfig& c) {
  if (!c.slurm || c.slurm->probe_ports.empty()) return make_rendezvous(c);
  const ddprun::launcher::SlurmLaunch& s = *c.slurm;
  auto at = [&c](uint16_t port) {
    LaunchConfig on_port = c;
    on_port.rdzv_endpoint.port = port;
    return make_rendezvous(on_port);
  };
  const std::string& token = s.settings.step_token;
  if (s.hosts_store) {
    return ddprun::launcher::host_on_first_free_port(s.store_host, s.probe_ports, token, at).rendezvous;
  }
  auto timeout = millis(c.rdzv_timings.join_timeout);
  return at(ddprun::launcher::find_step_store(s.store_host, s.probe_ports, token, timeout));
}

// Where temporary log directories go: $TMPDIR as std::filesystem reads it, or /tmp when $TMPDIR names no
// directory.
std::filesystem::path temp_dir() {
  std::error_code ec;
  auto dir = std::filesystem::temp_directory_path(ec);
  return ec ? std::filesystem::path("/tmp") : dir;
}

// The whole launcher; main() only guards it.
int run_launcher(int argc, char** argv) {
  LaunchConfig config;
  std::vector<std::string> args(argv, argv + argc);
  ddprun::launcher::LauncherContext context{.env = ddprun::agent::current_environment()};
  auto parsed = ddprun::launcher::parse_launch_config(args, context.env, {}, config);
  if (parsed.should_exit) {
    (parsed.exit_code == 0 ? std::cout : std::cerr)
        << parsed.message << (parsed.message.ends_with('\n') ? "" : "\n");
    return parsed.exit_code;
  }
  if (!parsed.message.empty()) std::cerr << parsed.message << (parsed.message.ends_with('\n') ? "" : "\n");
  context.temp_dir = temp_dir();
  // ddprun-launch: --local-rank=N or --local_rank=N, as the workers' torch spells it.
  if (config.local_rank_arg == "auto") {
    config.local_rank_arg = ddprun::launcher::torch_local_rank_arg(config.python, context.env);
  }
  if (config.dry_run) {
    std::cout << ddprun::launcher::dry_run(config, context);
    return 0;
  }

  // Like torchrun, the agent's own messages go to stderr; stdout carries the workers' output only.
  spdlog::set_default_logger(spdlog::stderr_color_mt("ddprun"));
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  const std::string tag = ddprun::launcher::node_tag(
      config, ddprun::launcher::host_and_pid(ddprun::local_hostname(), std::to_string(getpid())));
  spdlog::set_pattern("[%H:%M:%S.%e] ddprun" + (tag.empty() ? "" : " " + tag) + " %l: %v");

  std::error_code cwd_error;
  const auto cwd = std::filesystem::current_path(cwd_error);
  const auto problems = ddprun::launcher::preflight(config, context.env, cwd_error ? "." : cwd.string());
  for (const std::string& problem : problems) std::cerr << problem << "\n";
  if (!problems.empty()) return ddprun::agent::kExitUsage;

  auto agent_cfg = ddprun::launcher::agent_config(config, context);
  if (agent_cfg.set_omp_threads) {
    std::cerr << "ddprun: setting OMP_NUM_THREADS=1 for each worker to avoid overloading the machine; set it "
                 "yourself to tune\n";
  }

  std::unique_ptr<ddprun::rdzv::RendezvousHandler> rdzv;
  try {
    rdzv = make_rendezvous_on_port(config);
  } catch (const ddprun::rdzv::BindError& e) {
    spdlog::error(
        "{}; pick another port (--master_port, or --rdzv_endpoint HOST:PORT), or use --standalone on "
        "a single node (a free port)",
        e.what());
    return ddprun::agent::kExitStoreFailed;
  } catch (const ddprun::rdzv::RendezvousError& e) {  // the store cannot be reached (RendezvousStoreError)
    spdlog::error("{}", e.what());
    return ddprun::agent::kExitRendezvousFailed;
  } catch (const ddprun::rdzv::StoreError& e) {  // Slurm store probing (slurm_port.h), a bad endpoint
    spdlog::error("{}", e.what());
    return ddprun::agent::kExitRendezvousFailed;
  }
  ddprun::agent::ElasticAgent agent(std::move(agent_cfg), std::move(rdzv));
  return agent.run();
}
}  // namespace

int main(int argc, char** argv) {
  // The orphan guard (agent/process/orphan_guard.h) is this program run as "ddprun-guard".
  if (auto guard_exit = ddprun::agent::guard_entry(argc, argv)) return *guard_exit;
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
