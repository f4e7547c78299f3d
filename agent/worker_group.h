// WorkerGroup and supervise(): this node's workers in one round, and the agent's decisions about them as a
// pure transition function — (group, event) -> actions — in the manner of torch elastic's WorkerGroup /
// WorkerState and _RendezvousJoinOp. supervise() does no I/O: it reads the event, updates the group and
// returns what to do; the agent loop (agent/loop/agent_loop.h) performs the actions and feeds their results
// back as events. So every decision is unit-tested event by event (tests/agent/worker_group_test.cc).
//
// Group states:
//
//   kHealthy --a worker failed--------------> kStopping: stop local workers, then probe liveness, then
//       |                                      publish kFailed (or kMembership if a node is dead)
//       |--hung (no progress)---------------> capture every rank's stack, then as a failure (exit 6)
//       |--a FileTimer deadline missed------> capture stacks, send the timer's signal to that worker
//       |--a peer stopped the round---------> kStopping: stop local workers (with the peer's signal, if any)
//       |--a signal------------------------> kStopping: forward it, publish kShutdown
//       |--the terminal holder (local rank 0, process/terminal.h) ended by SIGINT/SIGQUIT (Ctrl-C, Ctrl-\)
//       |                                   -> as that signal to the agent: the user's interrupt, no restart
//       |--store lost----------------------> kStopping (exit 3)
//       '--every local worker succeeded----> kSucceeded: node_done, wait in the exit barrier
//   kSucceeded --round stopped / barrier timeout / store lost--> kStopping (nothing runs: stopped at once)
//   kStopping --every worker reaped (kGroupStopped)--> kStopped, with one kFinish action:
//       kSucceeded (exit 0) | kRestart (a failure, counted in JobState) | kRejoin (membership change, not
//       counted) | kExit
//
// A second signal while stopping kills the workers at once; the same signal arriving from a peer that was
// first to get it (Slurm signals every node) is not a second one. Exit codes: agent/exit_codes.h.
//
// Threads: none; a WorkerGroup belongs to the agent loop. Nothing here throws except std::bad_alloc.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/exit_codes.h"
#include "agent/log_layout.h"
#include "agent/process/worker_launch.h"
#include "agent/worker_failure.h"
#include "agent/watchdog/stack_dump.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

enum class WorkerState {
  kHealthy,    // started, running
  kSucceeded,  // exited 0
  kFailed,     // exited non-zero or by a signal on its own
  kStopped,    // exited after the agent began stopping the group
};
// "running", "succeeded", "failed", "stopped": as `ddprun status` and the metrics name them.
const char* worker_state_name(WorkerState s);

// One local worker of one round: its blueprint resolved for the round (argv, environment, output routing, log
// files), its process and its state.
struct Worker {
  int local_rank = 0;
  int rank = 0;
  WorkerLaunch launch;
  WorkerLogPaths paths;
  pid_t pid = 0;  // 0 until spawned
  WorkerState state = WorkerState::kHealthy;
  ExitStatus status;  // valid once state != kHealthy
};

enum class GroupState { kHealthy, kSucceeded, kStopping, kStopped };

// What ended the group's supervision (the kFinish action).
enum class Outcome {
  kSucceeded,  // every node succeeded (or the exit barrier timed out): exit 0
  kRestart,    // a failure with restarts left: rendezvous again, counted against --max_restarts
  kRejoin,     // a node arrived or died: rendezvous again, not counted
  kExit,       // stop for good with exit_code
};

struct WorkerGroup {
  rdzv::RendezvousInfo round;
  std::vector<Worker> workers;  // index = local rank
  GroupState state = GroupState::kHealthy;
  std::vector<WorkerFailure> failures;  // in the order observed; the first one stopped the group
  std::optional<rdzv::RoundStop> stop;  // why the round ended, once known (ours or a peer's)
  int signal = 0;                       // the signal that ends the job here (0: none)
  bool store_lost = false;
  bool spawn_failed = false;
  bool in_exit_barrier = false;      // waiting for the other nodes; the loop arms exit_barrier_timeout
  bool hung = false;                 // --hang_timeout fired; the stacks are being captured
  std::map<int, std::string> notes;  // local rank -> why it is about to fail ("missed its deadline ...")
  std::string stack_summary;         // where the ranks were at the last capture, one group per line
  uint64_t steps = 0;  // the largest step a local rank reported (--max_no_progress_restarts), when last read
};

// The job across its rounds, as supervise() sees it. The loop sets it up; only supervise() changes it.
struct JobState {
  std::string host;              // this node's host name, for failure messages
  int restarts_done = 0;         // failures restarted so far, counted against SupervisionPolicy::max_restarts
  bool restart_counted = false;  // the last round ended in a restart counted in restarts_done
  // --max_no_progress_restarts: the largest step of the last failed attempt, and how many failed attempts in
  // a row did not pass the one before.
  uint64_t previous_steps = 0;
  int attempts_without_progress = 0;
};

struct GroupEvent {
  enum class Kind {
    kWorkerExited,    // local_rank, status, failure (filled in by the loop when !status.success())
    kSpawnFailed,     // error: a worker could not be started (the ones started are in `workers`)
    kRoundStopped,    // stop: published by any node for this round (the loop drops other rounds')
    kStoreLost,       // error: the watcher lost the store
    kSignal,          // signal: the agent received it
    kGroupStopped,    // every worker has exited and was reaped after a kStopWorkers
    kBarrierTimeout,  // exit_barrier_timeout passed in the exit barrier
    kLivenessProbed,  // result of kProbeLiveness: dead_nodes
    kStopPublished,   // result of kPublishStop: stop = the stop that won (maybe a peer's)
    kPublishFailed,   // result of kPublishStop: error, stop = the stop that could not be published
    kNodeDoneFailed,  // result of kMarkNodeDone: error
    kHung,            // no local rank made progress for hang_timeout (agent/watchdog/progress_monitor.h)
    kDeadlineMissed,  // a FileTimer expired: pid, local_rank (-1: not a worker), scope, signal
    kStacksCaptured,  // result of kCaptureStacks: stacks (global rank -> main thread's stack)
  };
  Kind kind = Kind::kSignal;
  int local_rank = 0;
  ExitStatus status;
  std::optional<WorkerFailure> failure;
  rdzv::RoundStop stop;
  std::string error;
  int signal = 0;
  std::vector<int> dead_nodes;
  pid_t pid = 0;
  std::string scope;
  std::map<int, Stack> stacks;
  double time = 0;  // kStacksCaptured: when (Unix seconds), for the failure it may record
  // kWorkerExited (a failure) and kGroupStopped, with --max_no_progress_restarts: the largest step the local
  // ranks wrote to their DDPRUN_PROGRESS_FILE (0: none), read by the loop.
  uint64_t steps = 0;
};

struct Action {
  enum class Kind {
    kLog,               // level, text
    kStopWorkers,       // signal: send it to every worker's group, SIGKILL after grace; -> kGroupStopped
    kKillWorkers,       // SIGKILL every worker now (a stop is already under way)
    kProbeLiveness,     // ask the rendezvous which nodes it knows gone (never waits); -> kLivenessProbed
    kPublishStop,       // stop: end the round for every node; -> kStopPublished | kPublishFailed
    kMarkNodeDone,      // tell the rendezvous this node succeeded; -> kNodeDoneFailed on error
    kPrintSummary,      // print the failure summary of group.failures
    kNoteLocalFailure,  // this node caused the failure (the c10d backend's cooldown)
    kFinish,            // outcome, exit_code, close_rendezvous
    kCaptureStacks,     // ask every running worker where it is; -> kStacksCaptured
    kSignalProcess,     // pid, signal: send it to that process only (a FileTimer's request)
  };
  enum class Level { kInfo, kWarn, kError };
  Kind kind = Kind::kLog;
  Level level = Level::kInfo;
  std::string text;
  int signal = 0;
  std::chrono::milliseconds grace{0};
  rdzv::RoundStop stop;
  Outcome outcome = Outcome::kExit;
  int exit_code = 0;
  bool close_rendezvous = true;  // kFinish: false when a signal ended the job (late agents may still join)
  pid_t pid = 0;
};

// The transition function. Updates `group` (and `job`: a failure it restarts is counted there) and returns
// the actions to perform, in order. `policy` is the job's (AgentConfig::supervision).
std::vector<Action> supervise(WorkerGroup& group, JobState& job, const GroupEvent& event,
                              const SupervisionPolicy& policy);

// A new round began. When nodes of the previous round are not in it (RendezvousInfo::dropped_nodes: lost, or
// too late) and that round ended in a counted restart, the restart is charged to their loss (a lost node's
// peers fail on collective errors) and given back. Returns the line to log, or "" when nothing was given
// back.
std::string give_back_restart(JobState& job, const rdzv::RendezvousInfo& round, const SupervisionPolicy& p);

// The signal that made a node stop the round (kShutdown with exit code 128+N), or 0.
int shutdown_signal(const rdzv::RoundStop& stop);

}  // namespace ddprun::agent
