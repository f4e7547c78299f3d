// LaunchConfig: the validated form of a ddprun command line, and the parser that builds it.
//
// ddprun accepts every torchrun flag (docs/cli.md has the table): both spellings (--nproc_per_node and
// --nproc-per-node), each also read from the environment variable PET_<NAME> (PET_NPROC_PER_NODE) when the
// flag is absent; a flag on the command line always wins. Everything from the training script on belongs to
// the script: `ddprun --nproc_per_node 2 train.py --nproc_per_node 5` gives train.py `--nproc_per_node 5`.
//
// Pure: no processes, sockets or files are touched, except count_gpu_devices() (launcher/cuda_devices.h:
// reads /proc, /sys and /dev), /sys and the CPU set for --numa-binding (launcher/numa_topology.h) and
// std::thread::hardware_concurrency() for `--nproc_per_node cpu|auto`. Thread-safe (no shared state). Each
// single value is judged by launcher/flag_values.h.
//
// Errors: a bad command line gives ParseResult{exit_code 2, should_exit true} and one message that starts
// with "ddprun: ", names the flag (and the PET_ variable when the value came from there), quotes the bad
// value and says what is expected. Nothing in LaunchConfig is meaningful after an error.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_config.h"  // HealthPolicy, EventLogHandler
#include "launcher/cuda_devices.h"     // count_gpu_devices, the default gpu_count
#include "launcher/flag_values.h"      // RdzvTimings
#include "launcher/numa_topology.h"    // --numa-binding
#include "launcher/slurm/slurm_env.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_auth.h"

namespace ddprun::launcher {

// Slurm mode (--slurm, or auto-detected: SLURM_JOB_ID and SLURM_PROCID set, --no_slurm absent and none of
// --nnodes, --node_rank, --master_addr, --master_port, --rdzv_endpoint, --standalone given, on the command
// line or as PET_ variables). The derived settings (launcher/slurm/slurm_env.h) are the defaults of the flags they
// stand for: a flag given with --slurm still wins. With c10d, the endpoint is <first host>:<first candidate
// port> and is_host defaults to "agent 0 hosts".
// --rdzv_auth: how the job's store admits agents (launcher/store_auth_setup.h, docs/security.md).
enum class AuthMode { kAuto, kMunge, kNone };
// "auto", "munge", "none"; nullopt for anything else.
std::optional<AuthMode> parse_auth_mode(const std::string& text);

struct SlurmLaunch {
  bool auto_detected = false;
  SlurmSettings settings;             // everything derived
  std::vector<SlurmDerived> used;     // the derived settings no flag overrode (--dry-run prints them)
  std::vector<uint16_t> probe_ports;  // store ports to probe in order (launcher/slurm/slurm_port.h); empty when a
                                      // flag gave the port (--rdzv_endpoint, or static's --master_port)
  std::string store_host;             // host of the store: LaunchConfig::rdzv_endpoint's
  bool hosts_store = false;           // this agent hosts the store (node rank 0 / task 0)
};

// How the agents of a job meet (--rdzv_backend, --standalone). torchrun labels --standalone "c10d"; ddprun
// runs it with the static handler: one node that hosts its own store on a free port of 127.0.0.1.
// kEtcd: torch's etcd backend, its protocol on etcd (rendezvous/etcd/etcd_rendezvous.h); kEtcdV2: ddprun's
// dynamic rendezvous with etcd as its store (torch's etcd-v2 name; the two launchers do not share such a
// job).
enum class RendezvousKind { kStatic, kC10d, kStandalone, kEtcd, kEtcdV2 };

// The backends whose node count, node rank, ranks and workers' store are decided at the rendezvous.
inline bool elastic_kind(RendezvousKind k) {
  return k == RendezvousKind::kC10d || k == RendezvousKind::kEtcd || k == RendezvousKind::kEtcdV2;
}
inline bool etcd_kind(RendezvousKind k) {
  return k == RendezvousKind::kEtcd || k == RendezvousKind::kEtcdV2;
}

// torchrun's --event-log-handler values: agent/agent_config.h.
using EventLogHandler = agent::EventLogHandler;

// --standalone: the workers' MASTER_ADDR, torchrun's (its standalone rendezvous endpoint is localhost:0); the
// store itself listens on 127.0.0.1.
inline constexpr const char* kStandaloneMasterAddr = "localhost";

struct LaunchConfig {
  int min_nodes = 1, max_nodes = 1;  // --nnodes N or MIN:MAX (MIN != MAX only with kC10d)
  int nproc_per_node = 1;            // resolved number
  std::string nproc_spec = "1";      // as given: int|cpu|gpu|auto
  RendezvousKind rdzv_kind = RendezvousKind::kStatic;
  // Where the agents meet, parsed once. kStatic: node 0's store, at --rdzv_endpoint when given (it must have
  // a port), else at --master_addr:--master_port. kC10d: the rendezvous store, --rdzv_endpoint with port
  // 29400 by default (none given: localhost:29400). kEtcd, kEtcdV2: the first etcd member, port 2379 by
  // default (none given: localhost:2379), the others in rdzv_fallbacks. kStandalone: 127.0.0.1 port 0 (the
  // store binds a free port). Under Slurm without a port given, the port is the first of
  // SlurmLaunch::probe_ports.
  rdzv::Endpoint rdzv_endpoint{"127.0.0.1", 29500};
  // kC10d: the rest of a comma-separated --rdzv_endpoint, tried in order after rdzv_endpoint when it does not
  // serve the job (its host was lost and the job moved: rendezvous/c10d/store_failover.h).
  std::vector<rdzv::Endpoint> rdzv_fallbacks;
  std::string rdzv_id = "none";
  // --standalone without --rdzv_id: the run id is a fresh UUID (torchrun's uuid4), made when the launcher
  // starts (rdzv_id is "none" until then). torchrun replaces a given --rdzv_id too; ddprun keeps it.
  bool random_run_id = false;
  // --rdzv_conf (keys: launcher/flag_values.h): the timings, torchrun's defaults and aliases resolved, and
  // is_host (nullopt: c10d hosts the store when the endpoint is an address of this machine).
  RdzvTimings rdzv_timings;
  std::optional<bool> is_host;
  bool store_failover = true;  // --rdzv_conf failover (c10d): survive the loss of the store host
  EtcdConf etcd;
  int max_restarts = 0;
  double monitor_interval = 0.1;       // seconds (accepted for compatibility; ddprun is event-driven)
  std::string start_method = "spawn";  // spawn|fork|forkserver accepted, all mean exec here
  std::string role = "default";
  bool module = false, no_python = false, run_path = false;
  // ddprun-launch (torch.distributed.launch) without --use_env: "--local-rank" or "--local_rank", passed to
  // the script as "<it>=<local rank>" before its own arguments; "auto" until main() asks the torch of
  // --python which spelling it uses (launcher/preflight.h). Empty for ddprun (torchrun: LOCAL_RANK only).
  std::string local_rank_arg;
  std::string log_dir;  // "" = none
  StdSpec redirects, tee;
  std::optional<std::set<int>> local_ranks_filter;  // "0,2" ; nullopt = all
  int node_rank = 0;  // kStatic only (c10d and standalone ignore it, as torchrun does)
  // --local_addr: the address other nodes reach this node at (c10d: its standby store, MASTER_ADDR once it
  // hosts the store); "" = the address this host reaches the store from.
  std::string local_addr;
  // Signal numbers, in the order given, without duplicates. Default
  // SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2 (torchrun: the first four). Names (SIGTERM, TERM, sigterm)
  // or numbers; SIGKILL/SIGSTOP/SIGCHLD rejected.
  std::vector<int> signals_to_handle;
  double shutdown_timeout = 30;       // seconds, grace between forwarded signal and SIGKILL
  double exit_barrier_timeout = 300;  // seconds (flag --exit_barrier_timeout, ddprun extension)
  // --exit_codes torchrun (ddprun extension): every failure exits 1, as torchrun's (usage errors stay 2);
  // default "ddprun": the codes of docs/cli.md.
  bool torchrun_exit_codes = false;
  double hang_timeout = 0;           // seconds, 0 = off (flag --hang_timeout, ddprun extension)
  int max_no_progress_restarts = 0;  // 0 = off (flag --max_no_progress_restarts, ddprun extension)
  agent::HealthPolicy health;        // --health_check* and --gpu_memory_wait (launcher/operation_flags.h)
  uint16_t metrics_port = 0;         // --metrics_port: the agent's /metrics, /healthz, /readyz; 0 = none
  std::string metrics_addr;          // --metrics_addr: the address it binds; "" = every interface
  // Bytes the store this agent hosts (node 0's, the c10d host's, a standby) may hold for its clients
  // (--store_memory_budget, ddprun extension; rendezvous/store/store_server.h's memory_budget).
  uint64_t store_memory_budget = uint64_t{256} << 20;
  bool prestart = false;      // --prestart (ddprun extension): agent/process/prestart.h
  double prestart_delay = 2;  // seconds (--prestart_delay, ddprun extension)
  // --python / env DDPRUN_PYTHON / env PYTHON_EXEC (as torchrun) (ddprun extension; torchrun uses
  // sys.executable)
  std::string python = "python3";
  bool dry_run = false;            // --dry-run / --dry_run
  std::string log_level = "info";  // --log_level / --log-level: trace|debug|info|warn|error|critical|off
  std::string training_script;
  std::vector<std::string> training_script_args;
  std::optional<SlurmLaunch> slurm;  // --slurm / auto-detected; nullopt = Slurm's variables are ignored
  // --virtual-local-rank: every worker gets LOCAL_RANK=0 and one device in CUDA_VISIBLE_DEVICES (its entry of
  // the launcher's CUDA_VISIBLE_DEVICES, else its local rank); a list too short is refused here.
  bool virtual_local_rank = false;
  // --duplicate-stdout-filters / --duplicate-stderr-filters (comma_separated_list); empty = none.
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;
  EventLogHandler event_log_handler = EventLogHandler::kNull;  // --event-log-handler
  std::filesystem::path event_log_file;                        // --event-log-handler file:PATH; "" = none
  double straggler_factor = 1.5;                               // --straggler_factor; 0 = off
  // --rdzv_secret_file and --rdzv_auth (docs/security.md): the file, the mode (auto, munge, none), and the
  // store's authentication chosen from them by the launcher's main before the rendezvous starts
  // (launcher/store_auth_setup.h; null: an open store).
  std::filesystem::path rdzv_secret_file;
  AuthMode rdzv_auth = AuthMode::kAuto;
  std::shared_ptr<const rdzv::StoreAuth> store_auth;
  // --numa-binding (no PET_ variable, as in torchrun): the mode, and the CPUs of each local rank (index),
  // chosen at parse time near GPU <local rank> (launcher/numa_topology.h); both empty without the flag.
  std::optional<NumaAffinity> numa_binding;
  std::vector<std::vector<int>> worker_cpus;

  // argv of worker `local_rank`: python -u [-m] script [local_rank_arg=N] args (with ${local_rank}
  // substituted), or the program itself with --no_python; --run_path runs python -u script args. Pure.
  std::vector<std::string> worker_argv(int local_rank) const;
  // How many leading arguments of worker_argv() are the interpreter's (python -u): 2; 0 with --no_python.
  size_t interpreter_args() const;
};

// should_exit: true for --help/--version (exit_code 0, message = text for stdout) and for errors (exit_code
// 2, message for stderr). should_exit false: go on; message then holds warnings ("ddprun: warning: ..."
// lines, for stderr) or is empty.
struct ParseResult {
  int exit_code = 0;
  bool should_exit = false;
  std::string message;
};

// argv as from main (argv[0] is the program name: "ddprun-launch" adds torch.distributed.launch's --use_env
// and --local_rank_style and passes --local-rank=N to the script); env: the process environment, used for
// PET_*, DDPRUN_PYTHON and PYTHON_EXEC; gpu_count: returns the number of visible CUDA devices, called only
// for
// --nproc_per_node gpu|auto (an empty function means count_gpu_devices); numa_machine: the machine as
// --numa-binding sees it, called only for that flag (an empty function reads /sys, env's CUDA_VISIBLE_DEVICES
// and this process's CPU set: read_numa_machine).
ParseResult parse_launch_config(const std::vector<std::string>& argv,
                                const std::map<std::string, std::string>& env,
                                const std::function<int()>& gpu_count, LaunchConfig& out,
                                const std::function<NumaMachine()>& numa_machine = {});

// Torchrun's ${local_rank} macro (Python string.Template.safe_substitute): "${local_rank}" and "$local_rank"
// become the rank, "$$" becomes "$", anything else is kept.
std::string substitute_local_rank(const std::string& arg, int local_rank);

}  // namespace ddprun::launcher
