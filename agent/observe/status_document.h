// The documents agents publish for `ddprun status` (docs/observability.md): each agent's status document
// (StatusReport writes it, status/<identity>) and the job-wide straggler report of node rank 0's agent
// (StragglerWatch, status/stragglers). One writer and one reader each, used by the agent and by
// `ddprun status` alike.
//
// Anyone who reaches an open store can write these keys, so the readers are tolerant: a document that is not
// a JSON object is unreadable (nullopt); inside one, a field of the wrong type reads as absent (its default),
// a rank entry that is not an object or lacks an integer rank is skipped, and every such problem is named
// in `problems` so the caller can say what it skipped. Nothing here throws but std::bad_alloc.
//
// Status document, schema version 1 (every field always written, null where unknown):
//   {"v": 1, "host", "pid", "backend", "state", "detail", "time" (unix seconds),
//    "round", "node_rank", "nodes", "local_world_size", "base_rank", "world_size",
//    "restarts_used", "restarts_max", "restarts_caused", "state_bytes",
//    "ranks": [{"rank", "local_rank", "pid", "state", "progress_age_s", "step", "step_time_s",
//               "before_collective_s", "state_step", "state_replica_step"}]}
// (the state_ fields: --state_memory, agent/state/state_stats.h; null without it)
// Straggler report: {"v": 1, "round", "factor", "time",
//                    "ranks": [{"rank", "host", "before_collective_s", "median_s", "since"}]}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

struct RankStatus {
  int rank = -1;
  int local_rank = -1;
  std::optional<int64_t> pid;
  std::string state;  // running, succeeded, failed, stopped ("" when unknown)
  std::optional<double> progress_age_s;
  std::optional<uint64_t> step;
  std::optional<double> step_time_s;
  std::optional<double> before_collective_s;
  std::optional<int64_t> state_step, state_replica_step;  // --state_memory: newest version here, at the buddy
};

struct StatusDocument {
  std::string host;
  std::optional<int64_t> pid;
  std::string backend;
  std::string state;  // forming, unhealthy, running, stopping, done, failed ("" when unknown)
  std::string detail;
  double time = 0;  // unix seconds of the publication (0: unknown)
  // The running round as this agent sees it (nullopt between rounds).
  std::optional<int> round, node_rank, nodes, base_rank, world_size;
  std::optional<int> local_world_size;
  int restarts_used = 0, restarts_max = 0, restarts_caused = 0;
  std::optional<uint64_t> state_bytes;  // --state_memory: the bytes the node's state directory holds
  std::vector<RankStatus> ranks;
};

struct StragglerEntry {
  int rank = -1;
  std::string host;
  double before_collective_s = 0;
  double median_s = 0;
  double since = 0;  // unix seconds the episode began
};

struct StragglerReport {
  int round = -1;
  double factor = 0;
  double time = 0;
  std::vector<StragglerEntry> ranks;
};

// The JSON text of each (invalid UTF-8 in free text replaced).
std::string status_document_text(const StatusDocument& doc);
std::string straggler_report_text(const StragglerReport& report);

// The readers (see the top of this file). `problems` gets one line per thing skipped or read as absent.
std::optional<StatusDocument> read_status_document(std::string_view text, std::vector<std::string>& problems);
std::optional<StragglerReport> read_straggler_report(std::string_view text,
                                                     std::vector<std::string>& problems);

}  // namespace ddprun::agent
