#include "agent/loop/straggler_watch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "agent/loop/event_queue.h"

namespace ddprun::agent {

namespace {

using json = nlohmann::json;

}  // namespace

std::vector<StragglerEpisode> StragglerWatch::sample(const rdzv::RendezvousInfo& round) {
  if (factor_ <= 0) return {};
  if (round.round != round_) {
    round_ = round.round;
    tracker_.reset();
    last_step_.clear();
    reread_index_ = true;
    flagged_.clear();  // the report of an earlier round: `ddprun status` ignores it
  }
  if (round.group_rank != 0) return {};
  const auto now = std::chrono::steady_clock::now();
  if (now < next_) return {};
  // Every other refresh (2 s apart, hence 3.9 s): with its own status, node 0 then makes one store request
  // per second (its read is a WAIT and a MULTI_GET); or 20 ms per node in a job of more than 200 nodes.
  next_ = now + std::max<std::chrono::milliseconds>(std::chrono::milliseconds(3900),
                                                    std::chrono::milliseconds(20) * round.group_world_size);
  std::vector<std::string> docs;
  try {
    docs = rdzv_.status_documents(reread_index_);
  } catch (const rdzv::RendezvousError& e) {
    spdlog::debug("straggler report: cannot read the agents' status: {}", e.what());
    return {};
  }
  std::map<int, double> seconds;
  std::map<int, std::string> hosts;
  int members = 0;
  for (const std::string& text : docs) {
    const json d = json::parse(text, nullptr, false);
    if (!d.is_object() || d.value("round", json()) != json(round_) || !d.contains("ranks")) continue;
    ++members;
    for (const json& r : d["ranks"]) {
      const json before = r.value("before_collective_s", json()), step = r.value("step", json());
      if (!before.is_number() || !step.is_number_unsigned() || !r.value("rank", json()).is_number()) continue;
      const int rank = r["rank"].get<int>();
      uint64_t& last = last_step_[rank];
      if (step.get<uint64_t>() == last) continue;  // no new step since the last sample
      last = step.get<uint64_t>();
      seconds[rank] = before.get<double>();
      hosts[rank] = d.value("host", "");
    }
  }
  reread_index_ = members < round.group_world_size;  // someone's document is missing: read the index again

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
  if (!changes.empty()) publish();
  return changes;
}

void StragglerWatch::publish() {
  json ranks = json::array();
  for (const auto& [rank, e] : flagged_) {
    ranks.push_back({{"rank", rank},
                     {"host", e.host},
                     {"before_collective_s", e.seconds},
                     {"median_s", e.median},
                     {"since", e.since}});
  }
  const json doc = {{"v", 1}, {"round", round_}, {"factor", factor_}, {"time", unix_now()}, {"ranks", ranks}};
  try {
    rdzv_.publish_stragglers(doc.dump(-1, ' ', false, json::error_handler_t::replace));
  } catch (const rdzv::RendezvousError& e) {
    spdlog::debug("cannot publish the straggler report: {}", e.what());
  }
}

}  // namespace ddprun::agent
