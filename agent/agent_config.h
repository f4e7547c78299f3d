// AgentConfig: what the per-node agent is told to run (torch's WorkerSpec, per local rank) and the policy it
// supervises its workers by. The launcher builds it (launcher/agent_config.h); the agent only reads it.
//
// Pure data and pure queries of it; thread-safe. Nothing throws except std::bad_alloc.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "agent/worker_env.h"

namespace ddprun::agent {

// torchrun's --event-log-handler values (torch.distributed.elastic.events.handlers): "null" (default),
// "console" (the agent's events as JSON lines on stderr, agent/observe/event_log.h), "dynamic_rendezvous" (a
// null handler too).
enum class EventLogHandler { kNull, kConsole, kDynamicRendezvous };

// Where one local rank's output goes (torchrun's --redirects / --tee / --local_ranks_filter, resolved).
struct WorkerOutput {
  bool stdout_to_file = false;
  bool stderr_to_file = false;
  bool stdout_to_console = true;
  bool stderr_to_console = true;
  // The stream is tee'd (--tee) to the console: each of its console lines gets the prefix (torch's TailLog
  // header: "[<role><local_rank>]:", or AgentConfig::log_line_prefix_template). A stream shown without --tee
  // reaches the console as the worker wrote it, as under torchrun.
  bool prefix_stdout = false;
  bool prefix_stderr = false;
};

// The blueprint of one local worker (torch's WorkerSpec, per local rank): what to run and where its output
// goes. The rest of its launch (ranks, environment, log paths) comes from each round.
struct WorkerSpec {
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up in PATH; no shell
  size_t interpreter_args = 0;    // leading argv entries that are the Python interpreter's (0: not Python)
  WorkerOutput output;
  std::vector<int> cpu_affinity;  // --numa-binding: the CPUs it is bound to; empty = the agent's own set
};

// How the agent supervises its worker group, for the whole job (agent/worker_group.h: supervise()).
struct SupervisionPolicy {
  int max_restarts = 0;  // failures restarted before the job fails (a membership change is not counted)
  // Exit code when signal N ends the job (received here, or on a peer that published it); absent: 128+N.
  std::map<int, int> signal_exit_codes;
  std::chrono::milliseconds shutdown_grace{30000};  // from the stop signal to SIGKILL
  std::chrono::milliseconds exit_barrier_timeout{300000};
  // --hang_timeout: a group in which no local rank makes progress for this long is hung (its stacks are
  // captured, then it is stopped as a failure); 0 = off. agent/watchdog/progress_monitor.h defines progress.
  std::chrono::milliseconds hang_timeout{0};
  // --max_no_progress_restarts: after this many failed attempts in a row that made no progress (the largest
  // step a local rank wrote to its DDPRUN_PROGRESS_FILE did not pass the previous attempt's), the job stops
  // with kExitNoProgress instead of restarting; 0 = off.
  int max_no_progress_restarts = 0;

  // The job's exit code when signal `sig` ends it.
  int exit_code_of_signal(int sig) const;
};

// Whether this node may join a round (agent/health/health_check.h): checked before every join; an unhealthy
// node stands aside (the job goes on without it where a spare or MIN < MAX allows) and checks again.
struct HealthPolicy {
  std::string command;  // --health_check: run with /bin/sh -c; "" = none
  std::chrono::milliseconds command_timeout{60000};
  bool builtin = true;  // --health_check_builtin: the log directory, /dev/shm, the GPUs through NVML
  // Free bytes --log_dir must have (the run directory, error files, workers' logs).
  uint64_t log_dir_min_free = uint64_t{64} << 20;
  std::chrono::milliseconds retry_interval{10000};  // --health_check_interval: between checks that failed
  int attempts = 3;  // --health_check_attempts: checks failed in a row before the agent exits kExitUnhealthy
  // --gpu_memory_wait: before a restart, how long to wait for the old generation's GPU memory to be released
  // (agent/health/gpu_memory.h); 0 = do not wait.
  std::chrono::milliseconds gpu_memory_wait{30000};
};

struct AgentConfig {
  std::string role = "default";
  std::string script_name;          // for messages ("train.py")
  std::vector<WorkerSpec> workers;  // index = local rank; its size is the local world size
  Env base_env;                     // inherited by every worker
  bool set_omp_threads = false;
  // Set to "1" for the workers when unset: the name their torch reads (worker_env).
  std::string nccl_async_error_handling_var = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
  bool virtual_local_rank = false;  // --virtual-local-rank (agent/worker_env.h: virtual_local_rank_env)
  SupervisionPolicy supervision;
  HealthPolicy health;
  // --metrics_port / --metrics_addr: the agent's HTTP endpoint (agent/observe/metrics_server.h); 0 = none.
  uint16_t metrics_port = 0;
  std::string metrics_addr;
  // --straggler_factor: the job-wide straggler rule (agent/observe/straggler_watch.h); 0 = off.
  double straggler_factor = 1.5;
  // --event_log_handler file:PATH: the agent's lifecycle events as JSON lines (agent/observe/lifecycle_log.h).
  std::filesystem::path event_log_file;
  std::vector<int> signals_to_handle;
  std::filesystem::path log_dir;  // "" = a temporary directory (kept only on failure) for error files
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (torch >= 2.1): the prefix of tee'd console lines, with
  // ${role_name}, ${rank} (global) and ${local_rank} substituted (template_substitute); "" = torch's
  // "[<role><local_rank>]:".
  std::string log_line_prefix_template;
  // --prestart: prestart_delay after each spawn, a standby per Python worker for the next round
  // (agent/process/prestart.h).
  bool prestart = false;
  std::chrono::milliseconds prestart_delay{2000};
  // --duplicate-stdout-filters / --duplicate-stderr-filters: tee'd console lines that contain one of them
  // also go to attempt_<n>/filtered_stdout.log / filtered_stderr.log (created whenever the list is
  // non-empty).
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;
  // --event-log-handler (agent/observe/event_log.h; $LOGLEVEL in base_env applies), and what its events
  // name: torch's rendezvous backend
  // ("static", "c10d") and entry point (basename of the program it runs).
  EventLogHandler event_log_handler = EventLogHandler::kNull;
  std::string rdzv_backend = "static";
  std::string entry_point;
};

// The console prefix of local rank `local_rank` (global rank `rank`) in a tee'd stream: torch's
// "[<role><local_rank>]:", or log_line_prefix_template substituted.
std::string console_prefix(const AgentConfig& config, int local_rank, int rank);

// torch's FileTimer is served (agent/watchdog/file_timer.h): TORCHELASTIC_ENABLE_FILE_TIMER=1 in base_env.
bool file_timer_enabled(const AgentConfig& config);
// Where the timer FIFO is: TORCHELASTIC_TIMER_FILE from base_env, else in the run directory.
std::filesystem::path timer_file(const AgentConfig& config, const std::filesystem::path& run_dir);
// Workers get the stack-dump hook (agent/watchdog/stack_dump.h): hang detection or the FileTimer is on.
bool stack_capture_enabled(const AgentConfig& config);
// The signal that makes a Python worker dump its stacks (SIGRTMIN+3: not used by glibc, Python or torch).
int stack_dump_signal();

}  // namespace ddprun::agent
