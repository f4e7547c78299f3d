#include "agent/observe/observer.h"

#include "agent/observe/rank_sample.h"

namespace ddprun::agent {

namespace {

constexpr std::chrono::seconds kMinGap{1};

}  // namespace

Observer::Observer(const AgentConfig& config, rdzv::RendezvousHandler& rendezvous, const JobState& job,
                   LifecycleLog& lifecycle)
    : config_(config),
      rdzv_(rendezvous),
      job_(job),
      lifecycle_(lifecycle),
      report_(config, job),
      channel_(config.straggler_factor) {}

void Observer::set_state(const std::string& state, const std::string& detail) {
  report_.set_state(state, detail);
  const auto now = Clock::now();
  due_ = last_ && now - *last_ < kMinGap ? *last_ + kMinGap : now;
  if (*due_ <= now) tick();
}

void Observer::set_group(const WorkerGroup* group) {
  report_.set_group(group);
  if (metrics_) {
    metrics_->refresh(job_.restarts_done, group, {}, rdzv_.hosted_store_stats(), channel_.flagged());
  }
}

std::string Observer::document() const {
  const WorkerGroup* group = report_.group();
  const std::optional<StateStats> state = state_ ? std::optional(state_()) : std::nullopt;
  return report_.document(group ? sample_ranks(*group) : std::vector<RankSample>{},
                          state ? &*state : nullptr);
}

void Observer::tick() {
  last_ = Clock::now();
  due_ = *last_ + kStatusInterval;
  const WorkerGroup* group = report_.group();
  const std::vector<RankSample> samples = group ? sample_ranks(*group) : std::vector<RankSample>{};
  const std::optional<StateStats> state = state_ ? std::optional(state_()) : std::nullopt;
  if (auto access = rdzv_.observer_store()) {
    StatusPost post{.access = std::move(*access),
                    .document = report_.document(samples, state ? &*state : nullptr)};
    if (group) {
      post.round = group->round.round;
      post.node_rank = group->round.group_rank;
      post.nodes = group->round.group_world_size;
    }
    channel_.post(std::move(post));
  }
  record_stragglers();
  if (metrics_) {
    metrics_->refresh(job_.restarts_done, group, samples, rdzv_.hosted_store_stats(), channel_.flagged());
    if (state) metrics_->refresh_state(*state);
  }
}

void Observer::record_stragglers() {
  for (const StragglerEpisode& c : channel_.take_episodes()) {
    EventFields fields = {
        {"rank", c.rank}, {"rank_host", c.host}, {"before_collective_s", c.seconds}, {"median_s", c.median}};
    if (c.flagged) fields["factor"] = config_.straggler_factor;
    lifecycle_.record(c.flagged ? "straggler" : "straggler_end", fields);
  }
}

}  // namespace ddprun::agent
