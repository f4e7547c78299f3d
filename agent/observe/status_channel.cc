#include "agent/observe/status_channel.h"

#include <spdlog/spdlog.h>

#include "rendezvous/round_keys.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"

namespace ddprun::agent {

StatusChannel::StatusChannel(double straggler_factor)
    : watch_(straggler_factor), thread_([this] { run(); }) {}

StatusChannel::~StatusChannel() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StatusChannel::post(StatusPost post) {
  {
    std::lock_guard lock(mu_);
    next_ = std::move(post);
    ++posted_;
  }
  cv_.notify_all();
}

std::vector<StragglerEpisode> StatusChannel::take_episodes() {
  std::lock_guard lock(mu_);
  return std::exchange(episodes_, {});
}

std::map<int, StragglerEpisode> StatusChannel::flagged() const {
  std::lock_guard lock(mu_);
  return flagged_;
}

bool StatusChannel::flush(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return handled_ == posted_; });
}

void StatusChannel::run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || next_; });
    if (stop_) return;
    const StatusPost p = std::move(*next_);
    next_.reset();
    const uint64_t seq = posted_;
    lock.unlock();
    publish(p);
    lock.lock();
    handled_ = seq;
    cv_.notify_all();
  }
}

void StatusChannel::publish(const StatusPost& p) {
  const std::string at = rdzv::format_endpoint(p.access.host, p.access.port);
  try {
    if (!store_ || store_at_ != at) {  // the first post, or the store moved (a failover)
      store_.reset();
      rdzv::StoreClientOptions options;
      options.connect_timeout = kObserverRequestTimeout;
      options.timeout = kObserverRequestTimeout;
      options.auth = p.access.auth;
      store_ = std::make_unique<rdzv::StoreClient>(p.access.host, p.access.port, options);
      store_at_ = at;
      registered_ = false;
      identities_.clear();
    }
    const rdzv::RoundKeys keys(p.access.run_id);
    keys.publish_status(*store_, p.access.identity, p.document, registered_);
    report_stragglers(p, *store_);
  } catch (const rdzv::StoreError& e) {
    spdlog::debug("cannot publish this agent's status at {}: {}", at, e.what());
    store_.reset();  // made again for the next post
  }
}

void StatusChannel::report_stragglers(const StatusPost& p, rdzv::Store& store) {
  if (p.round < 0 || !watch_.due(p.round, p.node_rank, p.nodes, std::chrono::steady_clock::now())) return;
  const rdzv::RoundKeys keys(p.access.run_id);
  if (watch_.reread_index() || identities_.empty()) identities_ = keys.status_identities(store);
  std::optional<std::string> report;
  auto changes = watch_.observe(keys.status_documents(store, identities_), p.nodes, report);
  if (report) keys.publish_stragglers(store, *report);
  std::lock_guard lock(mu_);
  flagged_ = watch_.flagged();
  episodes_.insert(episodes_.end(), changes.begin(), changes.end());
}

}  // namespace ddprun::agent
