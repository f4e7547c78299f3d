// ddprun: the per-node launcher, a drop-in for torchrun.
//
//   ddprun [torchrun flags] script.py [script args]
//   ddprun status [flags]      (launcher/status/status_command.h)
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
#include <random>
#include <utility>
#include <variant>

#include "agent/elastic_agent.h"
#include "agent/exit_codes.h"
#include "agent/process/orphan_guard.h"
#include "agent/worker_env.h"
#include "launcher/agent_config.h"
#include "launcher/dry_run.h"
#include "launcher/launch_config.h"
#include "launcher/preflight.h"
#include "launcher/rendezvous_options.h"
#include "launcher/slurm/slurm_port.h"
#include "launcher/status/status_command.h"
#include "launcher/store_auth_setup.h"
#include "launcher/torch_version.h"
#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/static_rendezvous.h"
#include "rendezvous/util/text_util.h"

namespace {

using ddprun::launcher::LaunchConfig;
using ddprun::launcher::millis;

// The handler of `c`'s backend, with the options of launcher/rendezvous_options.h.
std::unique_ptr<ddprun::rdzv::RendezvousHandler> make_rendezvous(const LaunchConfig& c) {
  struct Make {
    std::unique_ptr<ddprun::rdzv::RendezvousHandler> operator()(ddprun::rdzv::StaticRendezvousOptions o) {
      return std::make_unique<ddprun::rdzv::StaticRendezvous>(std::move(o));
    }
    std::unique_ptr<ddprun::rdzv::RendezvousHandler> operator()(ddprun::rdzv::DynamicRendezvousOptions o) {
      return std::make_unique<ddprun::rdzv::DynamicRendezvous>(std::move(o));
    }
    std::unique_ptr<ddprun::rdzv::RendezvousHandler> operator()(ddprun::rdzv::etcd::EtcdRendezvousOptions o) {
      return std::make_unique<ddprun::rdzv::etcd::EtcdRendezvous>(std::move(o));
    }
  };
  return std::visit(Make{}, ddprun::launcher::rendezvous_options(c));
}

// make_rendezvous, except under Slurm without a port given: then on the first free candidate port (agent 0),
// or on the candidate whose store belongs to this Slurm step (the other agents). See
// launcher/slurm/slurm_port.h.
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
    return ddprun::launcher::host_on_first_free_port(s.store_host, s.probe_ports, token, at, c.store_auth)
        .rendezvous;
  }
  auto timeout = millis(c.rdzv_timings.join_timeout);
  return at(ddprun::launcher::find_step_store(s.store_host, s.probe_ports, token, timeout, c.store_auth));
}

// Where temporary log directories go: $TMPDIR as std::filesystem reads it, or /tmp when $TMPDIR names no
// directory.
std::filesystem::path temp_dir() {
  std::error_code ec;
  auto dir = std::filesystem::temp_directory_path(ec);
  return ec ? std::filesystem::path("/tmp") : dir;
}

// What --dry-run shows for --standalone's run id (a UUID made at start).
constexpr const char* kRandomRunIdShown = "XXXXXXXX-XXXX-4XXX-XXXX-XXXXXXXXXXXX";

// A random (version 4) UUID, as Python's str(uuid.uuid4()): torchrun's --standalone run id.
std::string random_uuid4() {
  std::random_device random;
  unsigned char bytes[16];
  for (auto& b : bytes) b = static_cast<unsigned char>(random() & 0xff);
  bytes[6] = static_cast<unsigned char>((bytes[6] & 0x0f) | 0x40);  // version 4
  bytes[8] = static_cast<unsigned char>((bytes[8] & 0x3f) | 0x80);  // RFC 4122 variant
  std::string out;
  for (int i = 0; i < 16; ++i) {
    static const char kHex[] = "0123456789abcdef";
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0xf];
  }
  return out;
}

// What depends on the workers' torch (launcher/torch_version.h): ddprun-launch's --local-rank=N or
// --local_rank=N, and the NCCL variable torchrun sets.
void ask_workers_torch(LaunchConfig& config, ddprun::launcher::LauncherContext& context,
                       const std::string& cwd) {
  const auto torch = ddprun::launcher::probe_torch_version(config.python, context.env, cwd);
  if (config.local_rank_arg == "auto") config.local_rank_arg = ddprun::launcher::local_rank_arg(torch);
  context.nccl_async_error_handling_var = ddprun::launcher::nccl_async_error_handling_var(torch);
}

// The whole launcher; main() only guards it. Returns ddprun's exit code (docs/cli.md).
int launch(int argc, char** argv, LaunchConfig& config, ddprun::launcher::LauncherContext& context);

// --exit_codes torchrun: torchrun exits 1 on every failure (usage errors stay 2, as argparse's).
int run_launcher(int argc, char** argv) {
  LaunchConfig config;
  ddprun::launcher::LauncherContext context{.env = ddprun::agent::current_environment()};
  const int code = launch(argc, argv, config, context);
  const bool failure = code != ddprun::agent::kExitSuccess && code != ddprun::agent::kExitUsage;
  return config.torchrun_exit_codes && failure ? 1 : code;
}

// The store's authentication for the static and c10d backends (--rdzv_secret_file, --rdzv_auth); the etcd
// backends keep the rendezvous in etcd, which TLS protects. False (after saying why) when it cannot be set
// up.
bool set_up_store_auth(LaunchConfig& config, const ddprun::launcher::LauncherContext& context) {
  using ddprun::launcher::RendezvousKind;
  const bool legacy = config.rdzv_kind == RendezvousKind::kEtcd;
  if (legacy || config.rdzv_kind == RendezvousKind::kEtcdV2) {
    if (config.rdzv_secret_file.empty() && config.rdzv_auth != ddprun::launcher::AuthMode::kMunge)
      return true;
    spdlog::error(
        "--rdzv_secret_file and --rdzv_auth munge protect ddprun's own stores (static, c10d); the etcd "
        "backends "
        "keep the rendezvous in etcd: protect etcd with its TLS client certificates instead (--rdzv_conf "
        "protocol=https,{}; docs/security.md)",
        legacy ? "cacert=CA.pem,cert=CERT.pem,key=KEY.pem"
               : "ca_cert=CA.pem,ssl_cert=CERT.pem,ssl_cert_key=KEY.pem");
    return false;
  }
  try {
    const auto setup = ddprun::launcher::setup_store_auth(config.rdzv_auth, config.rdzv_secret_file,
                                                          config.rdzv_id, context.env);
    if (!setup.warning.empty()) spdlog::warn("{}", setup.warning);
    if (!setup.note.empty()) spdlog::info("{}", setup.note);
    config.store_auth = setup.auth;
    return true;
  } catch (const std::runtime_error& e) {
    spdlog::error("{}", e.what());
    return false;
  }
}

// The rendezvous handler, the store it hosts bound; `exit_code` set (and said) when it cannot be made.
std::unique_ptr<ddprun::rdzv::RendezvousHandler> make_handler(const LaunchConfig& config, int& exit_code) {
  try {
    return make_rendezvous_on_port(config);
  } catch (const ddprun::rdzv::BindError& e) {
    spdlog::error(
        "{}; pick another port (--master_port, or --rdzv_endpoint HOST:PORT), or use --standalone on "
        "a single node (a free port)",
        e.what());
    exit_code = ddprun::agent::kExitStoreFailed;
  } catch (const ddprun::rdzv::RendezvousError& e) {  // the store cannot be reached (RendezvousStoreError)
    spdlog::error("{}", e.what());
    exit_code = ddprun::agent::kExitRendezvousFailed;
  } catch (const ddprun::rdzv::StoreError& e) {  // Slurm store probing (slurm_port.h), a bad endpoint
    spdlog::error("{}", e.what());
    exit_code = ddprun::agent::kExitRendezvousFailed;
  }
  return nullptr;
}

// Like torchrun, the agent's own messages go to stderr; stdout carries the workers' output only.
void set_up_logging(const LaunchConfig& config) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("ddprun"));
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  const std::string tag = ddprun::launcher::node_tag(
      config, ddprun::launcher::host_and_pid(ddprun::local_hostname(), std::to_string(getpid())));
  spdlog::set_pattern("[%H:%M:%S.%e] ddprun" + (tag.empty() ? "" : " " + tag) + " %l: %v");
}

// The command line checked (and --dry-run answered), the logs, the preflight checks, the store's
// authentication, the rendezvous handler, then the agent's run: each step's failure is its exit code.
int launch(int argc, char** argv, LaunchConfig& config, ddprun::launcher::LauncherContext& context) {
  std::vector<std::string> args(argv, argv + argc);
  auto parsed = ddprun::launcher::parse_launch_config(args, context.env, {}, config);
  if (parsed.should_exit) {
    (parsed.exit_code == 0 ? std::cout : std::cerr)
        << parsed.message << (parsed.message.ends_with('\n') ? "" : "\n");
    return parsed.exit_code;
  }
  if (!parsed.message.empty()) std::cerr << parsed.message << (parsed.message.ends_with('\n') ? "" : "\n");
  context.temp_dir = temp_dir();
  std::error_code cwd_error;
  const auto cwd_path = std::filesystem::current_path(cwd_error);
  const std::string cwd = cwd_error ? "." : cwd_path.string();
  if (config.random_run_id) config.rdzv_id = config.dry_run ? kRandomRunIdShown : random_uuid4();
  if (config.dry_run) {
    ask_workers_torch(config, context, cwd);
    std::cout << ddprun::launcher::dry_run(config, context);
    return 0;
  }
  set_up_logging(config);
  const auto problems = ddprun::launcher::preflight(config, context.env, cwd);
  for (const std::string& problem : problems) std::cerr << problem << "\n";
  if (!problems.empty()) return ddprun::agent::kExitUsage;
  if (!set_up_store_auth(config, context)) return ddprun::agent::kExitUsage;
  int exit_code = 0;
  auto rdzv = make_handler(config, exit_code);
  if (!rdzv) return exit_code;
  // After the store's bind: a busy port starts no interpreter (launcher/preflight.h).
  ask_workers_torch(config, context, cwd);
  auto agent_cfg = ddprun::launcher::agent_config(config, context);
  if (agent_cfg.set_omp_threads) {
    std::cerr << "ddprun: setting OMP_NUM_THREADS=1 for each worker to avoid overloading the machine; set it "
                 "yourself to tune\n";
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
    if (argc >= 2 && std::string(argv[1]) == "status") {  // `ddprun status`: launcher/status/status_command.h
      return ddprun::launcher::status_main(std::vector<std::string>(argv + 2, argv + argc),
                                           ddprun::agent::current_environment());
    }
    return run_launcher(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "ddprun: internal error (unknown exception)\n");
  }
  return 1;
}
