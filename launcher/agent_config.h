// The agent's configuration for a LaunchConfig: the one translation that both a launch (launcher/main.cc)
// and --dry-run (launcher/dry_run.h) use, so that the plan shows what a launch does.
//
// Pure: no processes, sockets or files (the caller passes what it knows of its process in a
// LauncherContext). Thread-safe (no shared state). Nothing throws except std::bad_alloc.
#pragma once

#include <filesystem>
#include <string>

#include "agent/agent_config.h"
#include "launcher/launch_config.h"

namespace ddprun::launcher {

// What the launcher knows of its own process, besides the command line.
struct LauncherContext {
  agent::Env env;                  // the launcher's environment: every worker inherits it
  std::filesystem::path temp_dir;  // for the log files -r/-t ask for when --log_dir is not given
  // The NCCL variable the workers' torch reads, set to 1 when unset (launcher/torch_version.h).
  std::string nccl_async_error_handling_var = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
  // --state_memory's directory for this agent: <$DDPRUN_STATE_ROOT, else /dev/shm>/ddprun-state-<pid>.
  std::filesystem::path state_dir;
};

// "<host name up to its first '.'>:<pid>": "node7:1234" for "node7.cluster" and "1234".
std::string host_and_pid(const std::string& host_name, const std::string& pid);

// The tag of this agent in its own log lines: with c10d `host_and_pid`
// (node ranks are known only after the rendezvous), with a static backend of more than one node
// "n<node_rank>", else "".
std::string node_tag(const LaunchConfig& c, const std::string& host_and_pid);

// The agent's configuration. Per local rank: argv (LaunchConfig::worker_argv) and where stdout/stderr go:
// to a file when --redirects or --tee name the stream; to the console unless --redirects names it without
// --tee, or --local_ranks_filter leaves the rank out; the console lines of a tee'd stream prefixed (as
// torch's TailLog: "[<role><local_rank>]:", or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE from context.env), the
// others shown as the worker wrote them. log_dir: --log_dir; without it context.temp_dir when -r/-t ask for
// log files, else "" (the agent then keeps its files in a temporary directory). --virtual-local-rank and each
// local rank's --numa-binding CPUs are passed on. OMP_NUM_THREADS=1 for more than one local worker unless
// context.env sets it. With --state_memory, the state's directory (context.state_dir) and --local_addr as the
// address the other agents reach this one at. Under Slurm, SIGTERM/SIGUSR1/SIGUSR2 end the job with
// agent::kExitSlurmInterrupted.
agent::AgentConfig agent_config(const LaunchConfig& c, const LauncherContext& context);

}  // namespace ddprun::launcher
