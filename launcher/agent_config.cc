#include "launcher/agent_config.h"

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>

#include "agent/exit_codes.h"

namespace ddprun::launcher {
namespace {

bool has(Std value, Std bit) {
  return (static_cast<int>(value) & static_cast<int>(bit)) != 0;
}

agent::WorkerOutput worker_output(const LaunchConfig& c, int local_rank) {
  const Std redirect = c.redirects.for_rank(local_rank);
  const Std tee = c.tee.for_rank(local_rank);
  const bool shown = !c.local_ranks_filter || c.local_ranks_filter->count(local_rank);
  agent::WorkerOutput o;
  o.stdout_to_file = has(redirect, Std::kOut) || has(tee, Std::kOut);
  o.stderr_to_file = has(redirect, Std::kErr) || has(tee, Std::kErr);
  o.stdout_to_console = shown && (!has(redirect, Std::kOut) || has(tee, Std::kOut));
  o.stderr_to_console = shown && (!has(redirect, Std::kErr) || has(tee, Std::kErr));
  // torch's TailLog prefixes the tee'd streams of the shown ranks only; the rest reach the console as
  // written.
  o.prefix_stdout = o.stdout_to_console && has(tee, Std::kOut);
  o.prefix_stderr = o.stderr_to_console && has(tee, Std::kErr);
  return o;
}

}  // namespace

std::string host_and_pid(const std::string& host_name, const std::string& pid) {
  return host_name.substr(0, host_name.find('.')) + ":" + pid;
}

std::string node_tag(const LaunchConfig& c, const std::string& host_and_pid) {
  if (elastic_kind(c.rdzv_kind)) return host_and_pid;
  return c.max_nodes > 1 ? "n" + std::to_string(c.node_rank) : "";
}

agent::AgentConfig agent_config(const LaunchConfig& c, const LauncherContext& context) {
  agent::AgentConfig a;
  a.role = c.role;
  a.script_name = c.training_script;
  a.base_env = context.env;
  a.set_omp_threads = c.nproc_per_node > 1 && !a.base_env.count("OMP_NUM_THREADS");
  a.nccl_async_error_handling_var = context.nccl_async_error_handling_var;
  a.virtual_local_rank = c.virtual_local_rank;
  a.supervision.max_restarts = c.max_restarts;
  a.supervision.shutdown_grace = millis(c.shutdown_timeout);
  a.supervision.exit_barrier_timeout = millis(c.exit_barrier_timeout);
  a.supervision.hang_timeout = millis(c.hang_timeout);
  a.supervision.max_no_progress_restarts = c.max_no_progress_restarts;
  a.health = c.health;
  a.metrics_port = c.metrics_port;
  a.straggler_factor = c.straggler_factor;
  a.event_log_file = c.event_log_file;
  a.metrics_addr = c.metrics_addr;
  if (c.slurm) {  // scancel, preemption, time limit, srun --signal: incomplete, may be requeued
    for (int sig : {SIGTERM, SIGUSR1, SIGUSR2})
      a.supervision.signal_exit_codes[sig] = agent::kExitSlurmInterrupted;
  }
  if (c.state.enabled()) {
    a.state = c.state;
    a.state.dir = context.state_dir;
    a.state.advertise_addr = c.local_addr;
  }
  a.prestart = c.prestart;
  a.prestart_delay = millis(c.prestart_delay);
  a.signals_to_handle = c.signals_to_handle;
  a.log_dir = c.log_dir;
  const bool log_files_asked = c.redirects != StdSpec{} || c.tee != StdSpec{};
  if (a.log_dir.empty() && log_files_asked) a.log_dir = context.temp_dir;
  if (auto it = context.env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); it != context.env.end())
    a.log_line_prefix_template = it->second;
  a.duplicate_stdout_filters = c.duplicate_stdout_filters;
  a.duplicate_stderr_filters = c.duplicate_stderr_filters;
  a.event_log_handler = c.event_log_handler;
  // What torch's events name: its rendezvous backend (standalone is c10d there) and the basename of its
  // entry point (sys.executable; the script with --no-python; its run_script_path function with --run-path).
  a.rdzv_backend = c.rdzv_kind == RendezvousKind::kStatic   ? "static"
                   : c.rdzv_kind == RendezvousKind::kEtcd   ? "etcd"
                   : c.rdzv_kind == RendezvousKind::kEtcdV2 ? "etcd-v2"
                                                            : "c10d";
  const std::string program = c.run_path ? "run_script_path" : c.worker_argv(0).front();
  a.entry_point = std::filesystem::path(program).filename().string();
  for (int lr = 0; lr < c.nproc_per_node; ++lr) {
    a.workers.push_back({.argv = c.worker_argv(lr),
                         .interpreter_args = c.interpreter_args(),
                         .output = worker_output(c, lr)});
    if (!c.worker_cpus.empty()) a.workers.back().cpu_affinity = c.worker_cpus[static_cast<size_t>(lr)];
  }
  return a;
}

}  // namespace ddprun::launcher
