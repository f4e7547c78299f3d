// worker_launches: what the agent spawns in one round, one WorkerLaunch per local rank (argv, complete
// environment, log files and console routing), from the agent's configuration and the rendezvous result; and
// the round's WorkerGroup made of them (the loop's assign step; the launcher's --dry-run shows the launches).
//
// Per local rank: the environment contract of agent/worker_env.h (restart count = the round number, since
// every round is a new attempt for the workers; with virtual_local_rank, LOCAL_RANK=0 and one device in
// CUDA_VISIBLE_DEVICES); the worker's cpu_affinity (--numa-binding); stdout to its log file when the rank's
// output says so, stderr always to its log file too (a failure report quotes its last lines); whole console
// lines when more than one worker shares the console; the console prefix (console_prefix(): torch's
// "[<role><local_rank>]:" or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE's) on each stream whose output says
// prefix_stdout / prefix_stderr (tee'd). With hang detection or torch's FileTimer on:
// TORCHELASTIC_TIMER_FILE, DDPRUN_PROGRESS_FILE, and the stack-dump hook (PYTHONPATH first entry,
// DDPRUN_STACK_SIGNAL), see agent/agent_config.h. With --state_memory: DDPRUN_STATE_DIR, DDPRUN_STATE_QUOTA
// and python_hooks/ first on PYTHONPATH (import ddprun.state; agent/state/state_keeper.h). With
// --duplicate-*-filters, a stream both written to its log file and shown (tee'd, not dropped by
// --local_ranks_filter) gets the filters and the same prefix (its file: open_filtered_logs()).
//
// worker_launches() is pure (open_filtered_logs() creates files): it touches no file or process. Thread-safe.
// Precondition (a broken one is a bug, not a user error): paths has one entry per local rank
// (config.workers.size()).
#pragma once

#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/log_layout.h"
#include "agent/process/worker_launch.h"
#include "agent/worker_group.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

// info: this node's round (local rank lr has global rank info.rank_of(lr)); paths: its log paths (index =
// local rank); run_id: the rendezvous run id (TORCHELASTIC_RUN_ID).
std::vector<WorkerLaunch> worker_launches(const AgentConfig& config, const rdzv::RendezvousInfo& info,
                                          const std::vector<WorkerLogPaths>& paths,
                                          const std::string& run_id);

// The group of one round, every worker kHealthy and not yet spawned: worker_launches() for each local rank,
// and its global rank (round.rank_of).
WorkerGroup make_worker_group(const AgentConfig& config, const rdzv::RendezvousInfo& round,
                              const std::vector<WorkerLogPaths>& paths, const std::string& run_id);

// Not pure: creates <attempt_dir>/filtered_stdout.log / filtered_stderr.log, empty, for each stream whose
// --duplicate-*-filters list is non-empty (torch does so every attempt, whether or not a line matches), and
// gives the file to every worker of the group that filters that stream. Throws
// std::filesystem::filesystem_error naming the file.
void open_filtered_logs(const AgentConfig& config, const std::filesystem::path& attempt_dir,
                        WorkerGroup& group);

}  // namespace ddprun::agent
