#include "rendezvous/c10d/loss_reporter.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

#include "rendezvous/c10d/c10d_round.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

struct LossReporter::Queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> identities;
  bool closed = false;
};

LossReporter::LossReporter(RoundKeys keys, std::shared_ptr<const StoreAuth> auth)
    : keys_(std::move(keys)), auth_(std::move(auth)), queue_(std::make_shared<Queue>()) {}

LossReporter::~LossReporter() {
  {
    std::lock_guard lock(queue_->mu);
    queue_->closed = true;
  }
  queue_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::function<void(const std::string&)> LossReporter::hook() const {
  // The queue, not `this`: the store may outlive the reporter by a moment.
  return [queue = queue_, prefix = "/" + keys_.key("live/")](const std::string& key) {
    if (!key.starts_with(prefix)) return;
    {
      std::lock_guard lock(queue->mu);
      if (queue->closed) return;
      queue->identities.push_back(key.substr(prefix.size()));
    }
    queue->cv.notify_one();
  };
}

void LossReporter::start(const std::string& host, uint16_t port) {
  thread_ = std::thread([this, host, port] { run(host, port); });
}

void LossReporter::run(const std::string& host, uint16_t port) {
  std::unique_ptr<StoreClient> store;
  while (true) {
    std::string identity;
    {
      std::unique_lock lock(queue_->mu);
      queue_->cv.wait(lock, [&] { return queue_->closed || !queue_->identities.empty(); });
      if (queue_->closed) return;
      identity = std::move(queue_->identities.front());
      queue_->identities.pop_front();
    }
    try {
      if (!store) {
        store = std::make_unique<StoreClient>(host, port,
                                              StoreClientOptions{.connect_timeout = std::chrono::seconds(5),
                                                                 .timeout = std::chrono::seconds(5),
                                                                 .auth = auth_});
      }
      // The job's current round as the store knows it (none yet: nobody to lose).
      if (!store->check({keys_.key("round")})) continue;
      const auto r = parse_int_in<int>(store->get(keys_.key("round")), 0, INT32_MAX);
      if (!r) continue;
      const std::string members_key = keys_.round_key(*r, "members");
      if (!store->check({members_key})) continue;
      const std::vector<std::string> members = decode_identities(store->get(members_key));
      const auto it = std::find(members.begin(), members.end(), identity);
      if (it == members.end()) continue;
      const int rank = static_cast<int>(it - members.begin());
      const std::string detail =
          "node " + std::to_string(rank) + " lost: its agent's connection to the store closed";
      const RoundStop won = keys_.stop(*store, *r, RoundStop{RoundStop::Kind::kMembership, -1, detail, 0});
      if (won.detail == detail)
        spdlog::warn("rendezvous {} round {}: {}; re-forming without it", keys_.run_id(), *r, detail);
    } catch (const StoreError& e) {
      spdlog::debug("rendezvous {}: cannot report a lost agent: {}", keys_.run_id(), e.what());
      store.reset();
    }
  }
}

}  // namespace ddprun::rdzv
