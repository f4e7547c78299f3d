#include "agent/observe/straggler_watch.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "agent/observe/status_document.h"
#include "rendezvous/util/text_util.h"
#include "rendezvous/util/unix_time.h"

namespace ddprun::agent {

bool StragglerWatch::due(int round, int node_rank, int nodes, std::chrono::steady_clock::time_point now) {
  if (factor_ <= 0) return false;
  if (round != round_) {
    round_ = round;
    tracker_.reset();
    last_step_.clear();
    reread_index_ = true;
    flagged_.clear();  // the report of an earlier round: `ddprun status` ignores it
  }
  if (node_rank != 0) return false;
  if (now < next_) return false;
  // Every other status refresh (2 s apart, hence 3.9 s): with its own status, node 0 then makes about one
  // store request per second (its read is a WAIT and a MULTI_GET); or 20 ms per node beyond 200 nodes.
  next_ = now + std::max<std::chrono::milliseconds>(std::chrono::milliseconds(3900),
                                                    std::chrono::milliseconds(20) * nodes);
  return true;
}

std::vector<StragglerEpisode> StragglerWatch::observe(const std::vector<std::string>& documents, int nodes,
                                                      std::optional<std::string>& report) {
  std::map<int, double> seconds;
  std::map<int, std::string> hosts;
  int members = 0;
  std::vector<std::string> problems;
  for (const std::string& text : documents) {
    const auto d = read_status_document(text, problems);
    if (!d || d->round != round_) continue;
    ++members;
    for (const RankStatus& r : d->ranks) {
      if (!r.before_collective_s || !r.step) continue;
      uint64_t& last = last_step_[r.rank];
      if (*r.step == last) continue;  // no new step since the last sample
      last = *r.step;
      seconds[r.rank] = *r.before_collective_s;
      hosts[r.rank] = d->host;
    }
  }
  note_problems(problems);
  reread_index_ = members < nodes;  // someone's document is missing: read the index again

  std::vector<StragglerEpisode> changes;
  for (const StragglerChange& c : tracker_.observe(seconds)) {
    StragglerEpisode e{.rank = c.rank,
                       .host = hosts[c.rank],
                       .flagged = c.flagged,
                       .seconds = c.seconds,
                       .median = c.median,
                       .since = unix_now()};
    if (c.flagged) {
      spdlog::warn(
          "straggler: rank {} on {} spends {:.3f} s before its step's first collective, {:.1f}x the job's "
          "median of {:.3f} s ({} samples in a row; --straggler_factor {})",
          c.rank, e.host, c.seconds, c.median > 0 ? c.seconds / c.median : 0.0, c.median, tracker_.window(),
          factor_);
      flagged_[c.rank] = e;
    } else {
      e.since = flagged_[c.rank].since;
      spdlog::info(
          "rank {} on {} is no longer a straggler: {:.3f} s before its first collective, the job's "
          "median {:.3f} s",
          c.rank, e.host, c.seconds, c.median);
      flagged_.erase(c.rank);
    }
    changes.push_back(e);
  }
  if (!changes.empty()) report = report_text();
  return changes;
}

std::string StragglerWatch::report_text() const {
  StragglerReport report{.round = round_, .factor = factor_, .time = unix_now()};
  for (const auto& [rank, e] : flagged_) {
    report.ranks.push_back(StragglerEntry{.rank = rank,
                                          .host = e.host,
                                          .before_collective_s = e.seconds,
                                          .median_s = e.median,
                                          .since = e.since});
  }
  return straggler_report_text(report);
}

// Once per distinct set of problems: a stranger's document read every few seconds must not flood the log.
void StragglerWatch::note_problems(const std::vector<std::string>& problems) {
  std::string text = join(problems, "; ");
  if (text.empty() || text == last_problems_) return;
  last_problems_ = std::move(text);
  spdlog::warn(
      "straggler report: parts of the agents' status documents could not be read and were skipped: {}",
      last_problems_);
}

}  // namespace ddprun::agent
