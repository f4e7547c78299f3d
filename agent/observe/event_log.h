// event_log: torch elastic's agent events (torch.distributed.elastic.events), for --event-log-handler.
//
// torch's agent records an Event at fixed points of its run (agent/server/api.py: _construct_event); with
// the "console" handler each one is a line on stderr: json.dumps(asdict(Event)), i.e.
//
//   {"name": "torchelastic.worker.status.<STATE>", "source": "AGENT", "timestamp": 0, "metadata": {...}}
//
// with the metadata keys run_id, global_rank, group_rank, worker_id, role, hostname, state, total_run_time,
// rdzv_backend, raw_error, metadata (itself a JSON string: group_world_size, entry_point, and for a worker
// local_rank, role_rank, role_world_size, exit_code, worker_pid as one-element lists), agent_restarts,
// duration_ms, in that order, written as Python's json.dumps writes them (", " and ": " separators, non-ASCII
// as \uXXXX, None as null). Where the agent records them: agent/observe/job_events.h.
//
// torch's events logger has the level of $LOGLEVEL (default INFO): WARNING or above hides the events.
//
// Pure except error_file_json() (reads a file). Thread-safe. Nothing throws but std::bad_alloc.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_config.h"

namespace ddprun::agent {

// The handler prints (console) and $LOGLEVEL (nullptr: unset) lets INFO records through: unset, DEBUG,
// INFO or anything Python's logging does not know; not WARN, WARNING, ERROR, CRITICAL, FATAL, nor NOTSET
// (the events logger then takes the root logger's WARNING).
bool events_printed(EventLogHandler handler, const char* loglevel);

// The fields of one event (torch's _construct_event arguments and the agent's state at that moment).
struct StatusEvent {
  std::string state;         // RENDEZVOUS, ASSIGN_WORKER_RANKS, SUCCEEDED, FAILED, TERMINATED
  bool from_worker = false;  // source WORKER (else AGENT)
  std::string run_id;
  std::optional<int> group_rank, group_world_size;  // none before the first round
  std::string role;
  std::string hostname;
  long total_run_time = 0;   // whole seconds of the agent's run, once it ended (0 before)
  std::string rdzv_backend;  // "static" or "c10d"
  std::optional<std::string> raw_error;
  std::string entry_point;  // basename of the program torch would run ("python3")
  int agent_restarts = 0;   // restarts done so far
  std::optional<double> duration_ms;
  struct WorkerFields {
    int global_rank = 0, local_rank = 0, role_rank = 0, role_world_size = 0;
    long worker_id = 0;                        // its pid
    std::optional<int> exit_code, worker_pid;  // a failed worker's (exit code, or -signal)
  };
  std::optional<WorkerFields> worker;
};

// Python's json.dumps(value) with its defaults: ", " and ": " separators, ensure_ascii (non-ASCII as \uXXXX),
// the keys in their order (ordered_json, as a Python dict keeps them), None as null.
std::string python_dumps(const nlohmann::ordered_json& value);

// The event's line, byte for byte as torch's console handler prints it, without the '\n'.
std::string status_event_json(const StatusEvent& e);

// torch's raw_error of a failed worker: json.dumps of its error file's JSON, or of {"message": "<NONE>"}
// when the file is missing or not JSON.
std::string error_file_json(const std::filesystem::path& error_file);

}  // namespace ddprun::agent
