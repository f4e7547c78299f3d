// `ddprun status`: a running job as its agents describe it. Every agent publishes a status document in the
// job's store (agent/observe/status_report.h); read_job_status reads them all — a fixed number of store
// requests plus one CHECK of the c10d agents' connection-bound live/ keys (more only where some are gone) —
// and derives the job's state, each node's and each rank's. Read-only: it writes nothing to the store.
//
// The result is the JSON that `ddprun status --json` prints (schema version 1, docs/observability.md):
//   {"v": 1, "run_id", "endpoint", "state" (forming | running | restarting | done | failed), "round",
//    "restarts": {"used", "max"}, "time",
//    "nodes": [{"identity", "node_rank" (null: not in the round), "host", "agent_pid", "state", "detail",
//               "heartbeat_age_s", "local_world_size", "ranks", "restarts_caused", "state_bytes"}],
//    "ranks": [{"rank", "node_rank", "local_rank", "host", "pid", "state", "progress_age_s", "step",
//               "step_time_s", "before_collective_s", "straggler", "state_step", "state_replica_step"}],
//    "skipped": ["agent <identity>: <what could not be read>", ...]}
// A node's state is its agent's (forming, unhealthy, running, stopping, done, failed), or: lost (c10d: its
// agent's connection to the store is gone before it finished), spare (it waits while the job runs a round
// without it). `straggler`: true when the agent of node rank 0 flagged the rank in this round's straggler
// report (agent/observe/straggler_watch.h), false when not, null when the rank reports no time before its
// first collective (it cannot be compared). The state_ fields (--state_memory, docs/state.md): the bytes the
// node's state directory holds, a rank's newest committed version there and the newest its buddy holds a copy
// of; null without --state_memory (the table shows their columns only when some node has them).
//
// The documents are read tolerantly (agent/observe/status_document.h): anyone who reaches an open store can
// write them, so what cannot be read is skipped, listed under "skipped", and the rest is shown.
//
// Threads: any; no state. Throws JobNotFound (no agent of that run id published a status), StoreError (the
// store failed), std::bad_alloc.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "rendezvous/store/store.h"

namespace ddprun::launcher {

class JobNotFound : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

nlohmann::json read_job_status(rdzv::Store& store, const std::string& run_id, const std::string& endpoint);

// The table for people: a line for the job, then one per node and one per rank.
std::string status_table(const nlohmann::json& status);

}  // namespace ddprun::launcher
