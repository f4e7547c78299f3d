// ElasticAgent: the per-node agent loop (torch's LocalElasticAgent, without its polling).
//
// One run of the loop: rendezvous -> a WorkerGroup for the round (agent/worker_group.h) -> spawn the local
// workers -> wait for events -> restart, re-join or stop. The decisions are supervise()'s, a pure transition
// function (agent/worker_group.h has the states); this class is its executor. It turns what its threads
// report into the group's events, performs the actions supervise() returns (stop or kill the workers, publish
// the end of the round, probe liveness, ...), and feeds their results back as events.
//
// Events come from: ProcessContext (a worker exited, at once; the group was stopped), a watcher thread
// blocked in RendezvousHandler::wait_round_stopped (the round was stopped by any node; the store was lost),
// and signals to the agent (forwarded to every worker's process group). A signal on one node stops every
// node: the others stop their workers with the same signal, and that signal reaching them too a moment later
// (Slurm signals every node) is not a second one (no SIGKILL).
//
// Threads: run() blocks the calling thread (the loop); an internal io_context thread owns the processes and
// signals; a watcher thread waits on the store. No worker outlives run(): every exit path stops and reaps
// the group. Exit codes: agent/exit_codes.h (docs/cli.md).
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/event_log.h"
#include "agent/exit_codes.h"
#include "agent/worker_env.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

// Where one local rank's output goes (torchrun's --redirects / --tee / --local_ranks_filter, resolved).
struct WorkerOutput {
  bool stdout_to_file = false;
  bool stderr_to_file = false;
  bool stdout_to_console = true;
  bool stderr_to_console = true;
  bool prefix_console = false;  // "[<node tag><role><local_rank>]:" before every console line
};

// The blueprint of one local worker (torch's WorkerSpec, per local rank): what to run and where its output
// goes. The rest of its launch (ranks, environment, log paths) comes from each round.
struct WorkerSpec {
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up in PATH; no shell
  size_t interpreter_args = 0;    // leading argv entries that are the Python interpreter's (0: not Python)
  WorkerOutput output;
  std::vector<int> cpu_affinity;  // --numa-binding: the CPUs it is bound to; empty = the agent's own set
};

struct AgentConfig {
  std::string role = "default";
  std::string script_name;          // for messages ("train.py")
  std::vector<WorkerSpec> workers;  // index = local rank; its size is the local world size
  Env base_env;                                       // inherited by every worker
  bool set_omp_threads = false;
  bool virtual_local_rank = false;  // --virtual-local-rank (agent/worker_env.h: virtual_local_rank_env)
  int max_restarts = 0;
  std::chrono::milliseconds shutdown_grace{30000};
  std::chrono::milliseconds exit_barrier_timeout{300000};
  std::vector<int> signals_to_handle;
  // Exit code when signal N ends the job (received here, or on a peer that published it); absent: 128+N.
  std::map<int, int> signal_exit_codes;
  std::filesystem::path log_dir;  // "" = a temporary directory (kept only on failure) for error files
  std::string node_tag;           // "" or e.g. "n1" (prefixed to console lines when nnodes > 1)
  // --hang_timeout: a group in which no local rank makes progress for this long is hung (its stacks are
  // captured, then it is stopped as a failure); 0 = off. agent/progress_monitor.h defines progress.
  std::chrono::milliseconds hang_timeout{0};
  // --prestart: prestart_delay after each spawn, a standby per Python worker for the next round
  // (agent/prestart.h).
  bool prestart = false;
  std::chrono::milliseconds prestart_delay{2000};
  // --duplicate-stdout-filters / --duplicate-stderr-filters: tee'd console lines that contain one of them
  // also go to attempt_<n>/filtered_stdout.log / filtered_stderr.log (created whenever the list is non-empty).
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;
  // --event-log-handler (agent/event_log.h; $LOGLEVEL in base_env applies), and what its events name: torch's
  // rendezvous backend ("static", "c10d") and entry point (basename of the program it runs).
  EventLogHandler event_log_handler = EventLogHandler::kNull;
  std::string rdzv_backend = "static";
  std::string entry_point;
};

// torch's FileTimer is served (agent/file_timer.h): TORCHELASTIC_ENABLE_FILE_TIMER=1 in base_env.
bool file_timer_enabled(const AgentConfig& config);
// Where the timer FIFO is: TORCHELASTIC_TIMER_FILE from base_env, else in the run directory.
std::filesystem::path timer_file(const AgentConfig& config, const std::filesystem::path& run_dir);
// Workers get the stack-dump hook (agent/stack_dump.h): hang detection or the FileTimer is on.
bool stack_capture_enabled(const AgentConfig& config);
// The signal that makes a Python worker dump its stacks (SIGRTMIN+3: not used by glibc, Python or torch).
int stack_dump_signal();

class ElasticAgent {
 public:
  ElasticAgent(AgentConfig config, std::unique_ptr<rdzv::RendezvousHandler> rendezvous);
  ~ElasticAgent();

  // Runs the job on this node until it succeeds, fails for good, or a signal ends it; returns the exit
  // code. Never throws: failures of the job, the store or the network become exit codes with a message, and
  // an unexpected exception (a bug) is logged and returns kExitInternal after every worker was stopped.
  // Call it once.
  int run();

 private:
  class Loop;
  std::unique_ptr<Loop> loop_;
};

}  // namespace ddprun::agent
