// ElasticAgent: the per-node agent loop (torch's LocalElasticAgent, without its polling).
//
// One round of the loop (agent/loop/agent_loop.h): rendezvous -> assign (a WorkerGroup for the round,
// agent/worker_group.h) -> spawn the local workers -> monitor -> restart, rejoin or finish. The decisions are
// supervise()'s, a pure transition function (agent/worker_group.h has the states); the loop is its executor.
// It turns what its threads report into the group's events, performs the actions supervise() returns (stop
// or kill the workers, publish the end of the round, probe liveness, ...), and feeds their results back as
// events. What it runs and by which policy: AgentConfig (agent/agent_config.h).
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

#include <memory>

#include "agent/agent_config.h"
#include "agent/exit_codes.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

class AgentLoop;

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
  std::unique_ptr<AgentLoop> loop_;  // agent/loop/agent_loop.h
};

}  // namespace ddprun::agent
