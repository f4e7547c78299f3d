// StragglerTracker: which ranks of a job are stragglers (docs/observability.md#stragglers).
//
// In synchronous training every rank's step lasts as long as the slowest rank's, so step times cannot name
// the slow rank; the time each rank spends before its step's first collective can (data loading, forward,
// compute: the slow rank starts its collectives last, the others wait inside theirs). Each sample gives the
// latest such time of every rank that reports one; a rank is flagged when its time is at least `factor` times
// the median of all ranks of the sample, and at least `min_excess_s` above it, in `window` samples in a
// row — one episode — and cleared when it is not for `window` samples in a row. Ranks that report nothing
// are never flagged and do not count in the median.
//
// Pure; not thread-safe. Nothing throws but std::bad_alloc.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ddprun::agent {

struct StragglerChange {
  int rank = 0;
  bool flagged = false;  // true: an episode begins; false: it ended
  double seconds = 0;    // the rank's time in this sample
  double median = 0;     // the job's median in this sample
};

// As the agent reports it (agent/observe/straggler_watch.h): a rank flagged now, or the change of an episode
// (flagged false: it ended).
struct StragglerEpisode {
  int rank = 0;
  std::string host;
  bool flagged = false;
  double seconds = 0;  // before the first collective, in the sample that decided
  double median = 0;   // the job's median in that sample
  double since = 0;    // unix seconds: when the episode began
};

class StragglerTracker {
 public:
  explicit StragglerTracker(double factor = 1.5, int window = 5, double min_excess_s = 0.01)
      : factor_(factor), window_(window), min_excess_s_(min_excess_s) {}

  // One sample: rank -> seconds before its first collective, for the ranks that made a new step since the
  // previous sample (the others keep their count). Returns the episodes that began or ended with it.
  std::vector<StragglerChange> observe(const std::map<int, double>& seconds);
  bool flagged(int rank) const;
  int window() const { return window_; }
  // The median of the last sample (0 before the first with two ranks).
  double median() const { return median_; }
  // Forgets every rank (a new round: new ranks).
  void reset();

 private:
  struct RankState {
    int streak = 0;  // samples in a row on the other side of the rule
    bool flagged = false;
  };
  double factor_;
  int window_;
  double min_excess_s_;
  double median_ = 0;
  std::map<int, RankState> ranks_;
};

}  // namespace ddprun::agent
