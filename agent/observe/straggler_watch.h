// StragglerWatch: the job-wide straggler report (docs/observability.md#stragglers). Every agent publishes
// each of its ranks' time before the step's first collective in its status document (status_report.h); the
// agent of node rank 0 of the running round reads all of them after its own status refresh (a WAIT and a
// MULTI_GET; the index again when a member's document is missing) — every 4 s, or 20 ms per node in a job of
// more than 200 nodes (parsing a thousand documents takes node 0 a tenth of a second or more) — feeds the
// ranks that made a new step to a StragglerTracker (agent/observe/straggler_tracker.h), logs one line per
// episode — a warning that names `rank N`, its host, its time and the job's median — and publishes the ranks
// flagged (RoundKeys::publish_stragglers, when they change) for `ddprun status`:
//   {"v": 1, "round", "factor", "time", "ranks": [{"rank", "host", "before_collective_s", "median_s",
//   "since"}]}
// Other agents do nothing. A new round forgets every episode.
//
// Threads: the agent loop's. A store error is logged at debug level (best effort, like the status); nothing
// else throws but std::bad_alloc.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "agent/observe/straggler_tracker.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

class StragglerWatch {
 public:
  // factor 0: off.
  StragglerWatch(double factor, rdzv::RendezvousHandler& rendezvous)
      : factor_(factor), tracker_(factor > 0 ? factor : 1.0), rdzv_(rendezvous) {}

  // After this agent's status refresh during `round`. Returns the episodes that began or ended.
  std::vector<StragglerEpisode> sample(const rdzv::RendezvousInfo& round);
  // The ranks flagged now (this agent compares: node rank 0), by rank.
  const std::map<int, StragglerEpisode>& flagged() const { return flagged_; }

 private:
  void publish();
  void note_problems(const std::vector<std::string>& problems);

  double factor_;
  StragglerTracker tracker_;
  rdzv::RendezvousHandler& rdzv_;
  int round_ = -1;
  std::chrono::steady_clock::time_point next_{};  // the next sample's time
  bool reread_index_ = true;
  std::map<int, uint64_t> last_step_;  // rank -> the step of its last sample
  std::map<int, StragglerEpisode> flagged_;
  std::string last_problems_;  // the problems last logged
};

}  // namespace ddprun::agent
