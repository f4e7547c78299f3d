#include "agent/observe/status_report.h"

#include <unistd.h>

#include "agent/observe/status_document.h"
#include "rendezvous/util/unix_time.h"

namespace ddprun::agent {

namespace {

constexpr size_t kMaxDetail = 200;

}  // namespace

void StatusReport::set_state(const std::string& state, const std::string& detail) {
  state_ = state;
  detail_ = detail.size() > kMaxDetail ? detail.substr(0, kMaxDetail) : detail;
}

std::string StatusReport::document(const std::vector<RankSample>& samples, const StateStats* state) const {
  StatusDocument d{.host = job_.host,
                   .pid = ::getpid(),
                   .backend = config_.rdzv_backend,
                   .state = state_,
                   .detail = detail_,
                   .time = unix_now(),
                   .local_world_size = static_cast<int>(config_.workers.size()),
                   .restarts_used = job_.restarts_done,
                   .restarts_max = config_.supervision.max_restarts,
                   .restarts_caused = restarts_caused_};
  if (state) d.state_bytes = state->bytes_held;
  if (group_) {
    const rdzv::RendezvousInfo& r = group_->round;
    d.round = r.round;
    d.node_rank = r.group_rank;
    d.nodes = r.group_world_size;
    d.base_rank = r.base_rank;
    d.world_size = r.world_size;
    for (size_t i = 0; i < group_->workers.size() && i < kMaxStatusRanks; ++i) {
      const Worker& w = group_->workers[i];
      RankStatus rank{
          .rank = w.rank, .local_rank = w.local_rank, .pid = w.pid, .state = worker_state_name(w.state)};
      if (i < samples.size()) {
        rank.progress_age_s = samples[i].age_s;
        if (const auto& beat = samples[i].beat) {
          rank.step = beat->step;
          rank.step_time_s = beat->step_s;
          rank.before_collective_s = beat->before_collective_s;
        }
      }
      if (state) {
        for (const StateStats::Rank& held : state->ranks) {
          if (held.rank != w.rank) continue;
          rank.state_step = held.step;
          rank.state_replica_step = held.replica_step;
        }
      }
      d.ranks.push_back(std::move(rank));
    }
  }
  return status_document_text(d);
}

}  // namespace ddprun::agent
