#include "launcher/flag_table.h"

#include <algorithm>

#include "rendezvous/util/text_util.h"

namespace ddprun::launcher {

namespace {

using K = FlagSpec::Kind;

constexpr FlagSpec kFlags[] = {
    {K::kValue, "--nnodes", "NNODES", "Number of nodes, N or MIN:MAX", "1:1", false},
    {K::kValue, "--nproc_per_node,--nproc-per-node", "NPROC_PER_NODE",
     "Workers per node: int, cpu, gpu or auto", "1", false},
    {K::kValue, "--rdzv_backend,--rdzv-backend", "RDZV_BACKEND",
     "Rendezvous backend: static, c10d, etcd or etcd-v2", "static", false},
    {K::kValue, "--rdzv_endpoint,--rdzv-endpoint", "RDZV_ENDPOINT", "Rendezvous endpoint host[:port]", "",
     false},
    {K::kValue, "--rdzv_id,--rdzv-id", "RDZV_ID", "User-defined job id shared by all nodes", "none", false},
    {K::kValue, "--rdzv_conf,--rdzv-conf", "RDZV_CONF", "Rendezvous settings KEY=VALUE,...", "", false},
    {K::kSwitch, "--standalone", "STANDALONE", "Single node: local c10d rendezvous on a free port", "",
     false},
    {K::kValue, "--max_restarts,--max-restarts", "MAX_RESTARTS", "Worker group restarts before failing", "0",
     false},
    {K::kValue, "--monitor_interval,--monitor-interval", "MONITOR_INTERVAL", "Seconds; accepted, unused",
     "0.1", false},
    {K::kValue, "--start_method,--start-method", "START_METHOD", "spawn, fork or forkserver (all exec)",
     "spawn", false},
    {K::kValue, "--event_log_handler,--event-log-handler", "EVENT_LOG_HANDLER",
     "torchrun's agent event handler: null, console (one JSON line per event on stderr) or "
     "dynamic_rendezvous; or file:PATH (ddprun's lifecycle events as JSON lines appended to PATH)",
     "null", false},
    {K::kValue, "--role", "ROLE", "User-defined role name of the workers", "default", false},
    {K::kSwitch, "-m,--module", "MODULE", "Run the script as a Python module (python -m)", "", false},
    {K::kSwitch, "--no_python,--no-python", "NO_PYTHON", "Execute the script directly, without python", "",
     false},
    {K::kSwitch, "--run_path,--run-path", "RUN_PATH",
     "Run the script path with python (precedence over --no_python)", "", false},
    {K::kValue, "--log_dir,--log-dir", "LOG_DIR", "Base directory for worker log files", "", false},
    {K::kValue, "-r,--redirects", "REDIRECTS", "Redirect std streams to log files: 0-3 or LR:N,...", "0",
     false},
    {K::kValue, "-t,--tee", "TEE", "Tee std streams to log files and console: 0-3 or LR:N,...", "0", false},
    {K::kValue, "--local_ranks_filter,--local-ranks-filter", "LOCAL_RANKS_FILTER",
     "Console shows only these ranks", "", false},
    {K::kValue, "--duplicate_stdout_filters,--duplicate-stdout-filters", "DUPLICATE_STDOUT_FILTERS",
     "Tee'd stdout lines containing one of these (comma-separated, ',,' = a comma) also go to "
     "filtered_stdout.log in the attempt's log directory",
     "", false},
    {K::kValue, "--duplicate_stderr_filters,--duplicate-stderr-filters", "DUPLICATE_STDERR_FILTERS",
     "Same for stderr and filtered_stderr.log", "", false},
    {K::kValue, "--node_rank,--node-rank", "NODE_RANK", "Rank of this node (static rendezvous)", "0", false},
    {K::kValue, "--master_addr,--master-addr", "MASTER_ADDR", "Address of node 0 (static rendezvous)",
     "127.0.0.1", false},
    {K::kValue, "--master_port,--master-port", "MASTER_PORT", "Port on node 0 (static rendezvous)", "29500",
     false},
    {K::kValue, "--local_addr,--local-addr", "LOCAL_ADDR", "Address of this node for the rendezvous", "",
     false},
    {K::kValue, "--logs_specs,--logs-specs", "", "torchrun LogsSpecs plugin: not supported by ddprun", "",
     false},
    {K::kValue, "--numa_binding,--numa-binding", "",
     "Bind local rank N to CPUs near GPU N: node, socket, exclusive or core-complex", "", false},
    {K::kSwitch, "--virtual_local_rank,--virtual-local-rank", "VIRTUAL_LOCAL_RANK",
     "LOCAL_RANK=0 for every worker, each seeing only its own GPU in CUDA_VISIBLE_DEVICES", "", false},
    {K::kValue, "--signals_to_handle,--signals-to-handle", "SIGNALS_TO_HANDLE",
     "Signals forwarded to workers", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2", false},
    {K::kValue, "--shutdown_timeout,--shutdown-timeout", "SHUTDOWN_TIMEOUT",
     "Seconds from forwarded signal to SIGKILL", "30", false},
    {K::kValue, "--exit_barrier_timeout,--exit-barrier-timeout", "",
     "Seconds to wait for other nodes at exit", "300", false},
    {K::kValue, "--store_memory_budget,--store-memory-budget", "STORE_MEMORY_BUDGET",
     "Memory the store this agent hosts may hold for its clients (unfinished requests, unread replies): "
     "bytes, or with a unit K, M, G (binary)",
     "256M", false},
    {K::kValue, "--exit_codes,--exit-codes", "EXIT_CODES",
     "ddprun (a failing worker's own code, 128+N for signal N, 2-8 and 75 for ddprun's own ends; "
     "docs/kubernetes.md) or torchrun (1 for every failure)",
     "ddprun", false},
    {K::kValue, "--max_no_progress_restarts,--max-no-progress-restarts", "MAX_NO_PROGRESS_RESTARTS",
     "Stop with exit code 7 (do not requeue) after this many failed attempts in a row whose ranks' step "
     "counter ($DDPRUN_PROGRESS_FILE) did not pass the previous attempt's (0 = off)",
     "0", false},
    {K::kValue, "--health_check,--health-check", "HEALTH_CHECK",
     "Command (run with /bin/sh -c) that must exit 0 before this node joins a round; an unhealthy node "
     "stands aside and checks again (docs/resilience.md)",
     "", false},
    {K::kValue, "--health_check_timeout,--health-check-timeout", "HEALTH_CHECK_TIMEOUT",
     "Seconds --health_check may run before it counts as failed", "60", false},
    {K::kValue, "--health_check_interval,--health-check-interval", "HEALTH_CHECK_INTERVAL",
     "Seconds between the checks of an unhealthy node", "10", false},
    {K::kValue, "--health_check_attempts,--health-check-attempts", "HEALTH_CHECK_ATTEMPTS",
     "Health checks failed in a row before the agent exits with code 8", "3", false},
    {K::kValue, "--health_check_builtin,--health-check-builtin", "HEALTH_CHECK_BUILTIN",
     "on: before each join, check --log_dir, /dev/shm and the GPUs (NVML) too; off: only --health_check",
     "on", false},
    {K::kValue, "--gpu_memory_wait,--gpu-memory-wait", "GPU_MEMORY_WAIT",
     "Seconds a restart waits for the previous workers' GPU memory to be released (NVML; 0 = off)", "30",
     false},
    {K::kValue, "--metrics_port,--metrics-port", "METRICS_PORT",
     "Serve /metrics (Prometheus), /healthz and /readyz on this port (0 = off)", "0", false},
    {K::kValue, "--metrics_addr,--metrics-addr", "METRICS_ADDR",
     "The address --metrics_port binds (an IPv4 or IPv6 address; default every interface)", "", false},
    {K::kValue, "--rdzv_secret_file,--rdzv-secret-file", "RDZV_SECRET_FILE",
     "A file holding the job's secret: every agent proves it to the store, which then admits only the job "
     "(docs/security.md). Make one with: (umask 077; openssl rand -hex 32 > FILE)",
     "", false},
    {K::kValue, "--rdzv_auth,--rdzv-auth", "RDZV_AUTH",
     "How the store admits agents: auto (--rdzv_secret_file if given, else MUNGE under Slurm when munged "
     "answers, else open), munge (required), none (open) (docs/security.md)",
     "auto", false},
    {K::kValue, "--straggler_factor,--straggler-factor", "STRAGGLER_FACTOR",
     "A rank whose time before its step's first collective stays this many times the job's median is named a "
     "straggler (0 = off)",
     "1.5", false},
    {K::kValue, "--hang_timeout,--hang-timeout", "HANG_TIMEOUT",
     "Seconds without progress from any local rank before the group counts as hung (0 = off)", "0", false},
    {K::kSwitch, "--prestart", "PRESTART",
     "Keep the next generation of Python workers started, torch imported, so a restart skips the "
     "interpreter's "
     "start-up (docs/cli.md lists what differs from a fresh process)",
     "", false},
    {K::kValue, "--prestart_delay,--prestart-delay", "PRESTART_DELAY",
     "Seconds after the workers start before the next generation is pre-started", "2", false},
    {K::kValue, "--state_memory,--state-memory", "STATE_MEMORY",
     "Keep the workers' training state (ddprun.state in Python, ddprun::sdk::state in C++) in this much of "
     "the node's memory "
     "(/dev/shm), copied to the next node: bytes, or with a unit K, M, G (binary); 0 = off (docs/state.md)",
     "0", false},
    {K::kValue, "--state_bandwidth,--state-bandwidth", "STATE_BANDWIDTH",
     "Bytes per second the copies of the training state to the next node may take (K, M, G: binary units); "
     "0 = no cap",
     "0", false},
    {K::kValue, "--python", "", "Python interpreter (env DDPRUN_PYTHON, PYTHON_EXEC)", "python3", false},
    {K::kSwitch, "--dry_run,--dry-run", "", "Print the launch plan and exit without starting anything", "",
     false},
    {K::kValue, "--log_level,--log-level", "", "trace, debug, info, warn, error, critical or off", "info",
     false},
    {K::kSwitch, "--slurm", "",
     "Take nodes, node rank, master, port and run id from Slurm (automatic under srun when no rendezvous "
     "flag is "
     "given; docs/slurm.md)",
     "", false},
    {K::kSwitch, "--no_slurm,--no-slurm", "", "Ignore Slurm's environment variables", "", false},
    {K::kSwitch, "--version", "", "Print the ddprun version and exit", "", false},
    // ddprun-launch: python -m torch.distributed.launch's own flags.
    {K::kSwitch, "--use_env,--use-env", "", "Pass the local rank in LOCAL_RANK only, not as --local-rank=N",
     "", true},
    {K::kValue, "--local_rank_style,--local-rank-style", "",
     "How the script gets its local rank without --use_env: --local-rank=N (dash, torch >= 2.0), "
     "--local_rank=N "
     "(underscore, torch 1.x), or auto: as the torch of --python spells it",
     "auto", true},
};

}  // namespace

std::span<const FlagSpec> flag_table() {
  return kFlags;
}

std::string canonical_flag(std::string_view names) {
  std::string_view canonical = names.substr(0, names.find(','));
  if (!canonical.starts_with("--")) canonical = names.substr(names.find(',') + 1);
  return std::string(canonical);
}

std::vector<std::vector<std::string>> flags_starting_with(std::string_view prefix, bool launch_mode) {
  std::vector<std::vector<std::string>> out;
  auto consider = [&](std::string_view names) {
    std::vector<std::string> spellings;
    for (std::string& spelling : split(names, ',')) {
      if (spelling.starts_with("--") && spelling.starts_with(prefix))
        spellings.push_back(std::move(spelling));
    }
    if (!spellings.empty()) out.push_back(std::move(spellings));
  };
  for (const FlagSpec& f : flag_table()) {
    if (!f.launch_only || launch_mode) consider(f.names);
  }
  consider("-h,--help");
  return out;
}

}  // namespace ddprun::launcher
