// WorkerFailure: what the agent knows of one worker's failure — when (its error file's timestamp, else when
// the agent saw it exit), which rank, how it ended, and what it left (torch's error file, its stderr's tail,
// where every rank was). supervise() (worker_group.h) collects them; the failure summary
// (agent/observe/failure_summary.h) prints them as torchrun does. Plain data.
#pragma once

#include <string>

namespace ddprun::agent {

struct WorkerFailure {
  double time = 0;   // unix seconds: error-file timestamp, else when the exit was seen
  std::string host;  // this node's short name (for ddprun's messages; the summary prints the FQDN, as torch)
  int rank = 0;
  int local_rank = 0;
  int exit_code = 0;  // 0 when killed by a signal
  int signal = 0;
  int pid = 0;
  std::string error_file;  // "" when none was written
  std::string message;     // the error file's message and/or ddprun's note (a hang, a missed deadline)
  // error_file set: ErrorFileContent::traceback. Otherwise the last lines of the worker's stderr.log ("" when
  // it has none), printed after torch's block.
  std::string traceback;
  std::string
      stacks;  // where every rank was (agent/watchdog/stack_dump.h), one group per line; "" = not captured
  std::string nccl_trace;  // the rank's NCCL flight-recorder dump (torch wrote it); "" = none
};

}  // namespace ddprun::agent
