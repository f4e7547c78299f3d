#include "launcher/status/status_command.h"

#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <thread>

#include "agent/exit_codes.h"
#include "launcher/flag_values.h"
#include "launcher/hostlist.h"
#include "launcher/slurm/slurm_env.h"
#include "launcher/status/job_status.h"
#include "launcher/store_auth_setup.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_probe.h"

namespace ddprun::launcher {

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::atomic<bool> interrupted{false};

struct Options {
  std::vector<rdzv::Endpoint> endpoints;  // tried in order
  std::string run_id = "none";
  bool json = false, watch = false;
  std::shared_ptr<const rdzv::StoreAuth> auth;  // --rdzv_secret_file: a store that requires the secret
};

// The flags, else PET_*, else Slurm's allocation, else torchrun's defaults. Throws UsageError.
Options parse(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
  CLI::App app{"ddprun status: a running job as its agents publish it (docs/observability.md)",
               "ddprun status"};
  std::string endpoint, run_id, backend, master_addr, master_port, secret_file, auth_mode;
  Options o;
  app.add_option("--rdzv_endpoint,--rdzv-endpoint", endpoint, "The job's store: host:port (c10d: a list)");
  app.add_option("--rdzv_id,--rdzv-id", run_id, "The job's --rdzv_id");
  app.add_option("--rdzv_backend,--rdzv-backend", backend, "static (default) or c10d");
  app.add_option("--master_addr,--master-addr", master_addr, "static: the store's host");
  app.add_option("--master_port,--master-port", master_port, "static: the store's port");
  app.add_option("--rdzv_secret_file,--rdzv-secret-file", secret_file,
                 "The job's secret file, when its store requires one (docs/security.md)");
  app.add_option("--rdzv_auth,--rdzv-auth", auth_mode,
                 "auto (the secret file, else MUNGE inside a Slurm job), munge or none, as the job's agents");
  app.add_flag("--json", o.json, "Print the JSON document instead of the table");
  app.add_flag("--watch", o.watch, "Redraw every second until Ctrl-C");
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    throw;
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string("ddprun status: ") + e.what() + " (see ddprun status --help)");
  }
  // The flag's value, else its PET_ variable's; the Given names where it came from (for messages).
  auto pick = [&](std::string& value, const std::string& flag, const char* pet) {
    const bool from_env = value.empty();
    if (from_env) value = env_or(env, pet, "");
    return Given{flag, value, from_env && !value.empty() ? pet : ""};
  };
  pick(backend, "--rdzv_backend", "PET_RDZV_BACKEND");
  if (backend.empty()) backend = "static";
  if (backend != "static" && backend != "c10d") {
    throw UsageError("ddprun status: --rdzv_backend " + backend +
                     ": only static and c10d jobs publish their status in ddprun's store (etcd: not yet)");
  }
  pick(run_id, "--rdzv_id", "PET_RDZV_ID");
  const Given g_endpoint = pick(endpoint, "--rdzv_endpoint", "PET_RDZV_ENDPOINT");
  const Given g_addr = pick(master_addr, "--master_addr", "PET_MASTER_ADDR");
  const Given g_port = pick(master_port, "--master_port", "PET_MASTER_PORT");
  const std::string job = env_or(env, "SLURM_JOB_ID", "");
  if (endpoint.empty() && master_addr.empty() && master_port.empty() && !job.empty()) {
    std::string error;
    auto hosts = expand_hostlist(env_or(env, "SLURM_JOB_NODELIST", env_or(env, "SLURM_NODELIST", "")), error);
    auto number = parse_uint(job);
    if (!hosts || hosts->empty() || !number) {
      throw UsageError(
          "ddprun status: inside Slurm job " + job +
          " but SLURM_JOB_NODELIST is unreadable; give --rdzv_endpoint (or --master_addr/--master_port)");
    }
    for (uint16_t port : slurm_port_candidates(*number)) o.endpoints.push_back({hosts->front(), port});
    o.run_id = run_id.empty() ? job : run_id;
  } else if (backend == "c10d" || !endpoint.empty()) {
    o.endpoints = parse_rdzv_endpoint(
        Given{"--rdzv_endpoint", endpoint.empty() ? "localhost" : endpoint, g_endpoint.env}, true,
        backend == "c10d" ? 29400 : 29500);
  } else {
    o.endpoints.push_back({master_addr.empty() ? "127.0.0.1" : parse_master_addr(g_addr),
                           master_port.empty() ? uint16_t{29500} : parse_master_port(g_port)});
  }
  if (!run_id.empty()) o.run_id = run_id;
  pick(secret_file, "--rdzv_secret_file", "PET_RDZV_SECRET_FILE");
  const Given g_auth = pick(auth_mode, "--rdzv_auth", "PET_RDZV_AUTH");
  const auto mode = parse_auth_mode(auth_mode.empty() ? "auto" : auth_mode);
  if (!mode)
    throw UsageError("ddprun status: " + (g_auth.env.empty() ? g_auth.flag : g_auth.env) + " " + auth_mode +
                     ": give auto, munge or none");
  try {
    const auto setup = setup_store_auth(*mode, secret_file, o.run_id, env);
    if (!setup.warning.empty()) std::cerr << "ddprun status: " << setup.warning << "\n";
    o.auth = setup.auth;
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("ddprun status: ") + e.what());
  }
  return o;
}

// The job's status from the first endpoint whose store holds it; sets `code` to the exit code otherwise.
std::optional<json> read_once(const Options& o, int& code, std::string& error) {
  code = agent::kExitStoreFailed;
  for (const auto& ep : o.endpoints) {
    try {
      // An observer: it proves the job's authentication to read, writes nothing, admits nobody (security.md).
      rdzv::StoreClient store(ep.host, ep.port, rdzv::probe_options(3s, 10s, o.auth, /*observer=*/true));
      return read_job_status(store, o.run_id, ep.to_string());
    } catch (const JobNotFound& e) {
      code = agent::kExitRendezvousFailed;
      error = e.what();
    } catch (const rdzv::StoreError& e) {
      if (code != agent::kExitRendezvousFailed) {
        error = "no store answers at " + ep.to_string() + " (" + e.what() +
                "): the job has ended, or give its --rdzv_endpoint (or --master_addr/--master_port)";
      }
    }
  }
  return std::nullopt;
}

}  // namespace

int status_main(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
  Options o;
  try {
    o = parse(args, env);
  } catch (const CLI::CallForHelp&) {
    std::cout << "usage: ddprun status [--rdzv_endpoint H:P] [--rdzv_id ID] [--rdzv_backend static|c10d]\n"
                 "                     [--master_addr A] [--master_port P] [--rdzv_secret_file FILE]\n"
                 "                     [--rdzv_auth auto|munge|none] [--json] [--watch]\n"
                 "Prints a running job as its agents publish it; docs/observability.md.\n";
    return 0;
  } catch (const UsageError& e) {
    std::cerr << e.what() << "\n";
    return agent::kExitUsage;
  }
  // What the store client logs (an open store joined under --rdzv_auth auto) goes to stderr, never into the
  // table or the JSON on stdout.
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "ddprun status", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  spdlog::set_pattern("ddprun status: %v");
  if (o.watch) {
    struct sigaction sa {};
    sa.sa_handler = [](int) { interrupted = true; };
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
  }
  while (true) {
    int code = 0;
    std::string error;
    const auto status = read_once(o, code, error);
    std::string text =
        status ? (o.json ? status->dump(2) + "\n" : status_table(*status)) : "ddprun status: " + error + "\n";
    if (o.watch) std::cout << "\x1b[H\x1b[2J";  // home, clear: redrawn in place
    (status ? std::cout : std::cerr) << text << std::flush;
    if (!o.watch) return status ? 0 : code;
    for (int i = 0; i < 10 && !interrupted; ++i) std::this_thread::sleep_for(100ms);
    if (interrupted) return 0;
  }
}

}  // namespace ddprun::launcher
