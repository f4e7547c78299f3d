// StragglerWatch: the job-wide straggler report (docs/observability.md#stragglers), as the agent of node
// rank 0 of the running round makes it. Every agent publishes each of its ranks' time before the step's first
// collective in its status document (status_report.h); node rank 0's StatusChannel (status_channel.h) reads
// all of them when due() says so — every 3.9 s, or 20 ms per node in a job of more than 200 nodes (parsing a
// thousand documents takes a tenth of a second or more) — and hands them to observe(), which feeds the ranks
// that made a new step to a StragglerTracker (straggler_tracker.h), logs one line per episode (a warning that
// names `rank N`, its host, its time and the job's median) and returns the report to publish
// (RoundKeys::publish_stragglers; status_document.h has its schema) when the flagged ranks changed. A new
// round forgets every episode. Documents are read tolerantly (status_document.h): what cannot be read is
// skipped and said once.
//
// Pure: no store I/O. Threads: one at a time (the StatusChannel's). Never throws but std::bad_alloc.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/observe/straggler_tracker.h"

namespace ddprun::agent {

class StragglerWatch {
 public:
  // factor 0: off (due() is always false).
  explicit StragglerWatch(double factor) : factor_(factor), tracker_(factor > 0 ? factor : 1.0) {}

  // Whether node rank `node_rank` of a round of `nodes` nodes reads the documents at `now` (only node rank 0
  // does). A new round forgets every episode of the last.
  bool due(int round, int node_rank, int nodes, std::chrono::steady_clock::time_point now);
  // Whether the status index must be read again before the documents (a member's document was missing).
  bool reread_index() const { return reread_index_; }
  // The documents read for the round of the last due(). Returns the episodes that began or ended; `report`
  // is set to the report's text when the flagged ranks changed.
  std::vector<StragglerEpisode> observe(const std::vector<std::string>& documents, int nodes,
                                        std::optional<std::string>& report);
  // The ranks flagged now, by rank.
  const std::map<int, StragglerEpisode>& flagged() const { return flagged_; }

 private:
  std::string report_text() const;
  void note_problems(const std::vector<std::string>& problems);

  double factor_;
  StragglerTracker tracker_;
  int round_ = -1;
  std::chrono::steady_clock::time_point next_{};  // the next sample's time
  bool reread_index_ = true;
  std::map<int, uint64_t> last_step_;  // rank -> the step of its last sample
  std::map<int, StragglerEpisode> flagged_;
  std::string last_problems_;  // the problems last logged
};

}  // namespace ddprun::agent
