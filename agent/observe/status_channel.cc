#include "agent/observe/status_channel.h"

#include <spdlog/spdlog.h>

#include "agent/observe/status_document.h"
#include "rendezvous/round_keys.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/unix_time.h"

namespace ddprun::agent {

StatusChannel::StatusChannel(double straggler_factor, std::chrono::milliseconds prune_interval)
    : watch_(straggler_factor),
      prune_interval_(prune_interval),
      next_prune_(std::chrono::steady_clock::now() + prune_interval),
      thread_([this] { run(); }) {}

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
    prune(p, *store_);
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

// Node rank 0 of the running round, once every kPruneInterval: the documents of agents that left the job more
// than kPruneAge ago go, and their index slots are emptied — finished agents, c10d agents whose connection
// is gone, static agents not in the round that stopped publishing. Spares (alive) and unhealthy agents
// (retrying) stay; a document that cannot be read is left as it is (`ddprun status` shows it as skipped).
void StatusChannel::prune(const StatusPost& p, rdzv::Store& store) {
  const auto now = std::chrono::steady_clock::now();
  if (p.round < 0 || p.node_rank != 0 || now < next_prune_) return;
  next_prune_ = now + prune_interval_;
  const rdzv::RoundKeys keys(p.access.run_id);
  const std::vector<rdzv::RoundKeys::StatusSlot> slots = keys.status_slots(store);
  std::vector<std::string> identities;
  for (const auto& slot : slots) identities.push_back(slot.identity);
  const std::vector<std::string> texts = keys.status_documents(store, identities);
  std::vector<size_t> old;  // slots of documents older than kPruneAge, not of the round
  std::vector<size_t> ask;  // of those, the c10d agents not finished: still connected?
  std::vector<std::string> live_keys;
  for (size_t i = 0; i < slots.size() && i < texts.size(); ++i) {
    std::vector<std::string> problems;
    const auto d = read_status_document(texts[i], problems);
    if (!d || d->round == p.round || d->state == "unhealthy" || unix_now() - d->time < kPruneAge.count())
      continue;
    if (d->backend == "c10d" && d->state != "done" && d->state != "failed") {
      ask.push_back(old.size());
      live_keys.push_back(keys.key("live/" + slots[i].identity));
    }
    old.push_back(i);
  }
  std::vector<bool> keep(old.size(), false);
  const std::vector<bool> present = rdzv::keys_present(store, live_keys);
  for (size_t k = 0; k < ask.size(); ++k) keep[ask[k]] = present[k];  // still connected: a spare
  int pruned = 0;
  for (size_t k = 0; k < old.size(); ++k) {
    if (keep[k]) continue;
    keys.prune_status(store, slots[old[k]]);
    ++pruned;
  }
  if (pruned > 0) {
    spdlog::info("status: removed the documents of {} agent(s) that left the job more than {} ago", pruned,
                 duration_text(std::chrono::duration_cast<std::chrono::milliseconds>(kPruneAge)));
  }
}

}  // namespace ddprun::agent
