#include "agent/observe/straggler_tracker.h"

#include <algorithm>

namespace ddprun::agent {

std::vector<StragglerChange> StragglerTracker::observe(const std::map<int, double>& seconds) {
  std::vector<StragglerChange> out;
  if (seconds.size() < 2) return out;  // nothing to compare with
  std::vector<double> times;
  for (const auto& [rank, t] : seconds) times.push_back(t);
  const size_t mid = times.size() / 2;
  std::nth_element(times.begin(), times.begin() + static_cast<long>(mid), times.end());
  double median = times[mid];
  if (times.size() % 2 == 0)
    median = (median + *std::max_element(times.begin(), times.begin() + static_cast<long>(mid))) / 2;
  median_ = median;
  for (const auto& [rank, t] : seconds) {
    RankState& r = ranks_[rank];
    const bool slow = t >= factor_ * median && t - median >= min_excess_s_;
    r.streak = slow != r.flagged ? r.streak + 1 : 0;
    if (r.streak < window_) continue;
    r.flagged = slow;
    r.streak = 0;
    out.push_back({.rank = rank, .flagged = slow, .seconds = t, .median = median});
  }
  return out;
}

bool StragglerTracker::flagged(int rank) const {
  auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.flagged;
}

void StragglerTracker::reset() {
  ranks_.clear();
  median_ = 0;
}

}  // namespace ddprun::agent
