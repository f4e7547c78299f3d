#include "rendezvous/etcd/lease_keeper.h"

#include <spdlog/spdlog.h>

namespace ddprun::rdzv::etcd {

LeaseKeeper::LeaseKeeper(std::unique_ptr<Client> client)
    : client_(std::move(client)), thread_([this] { run(); }) {}

LeaseKeeper::~LeaseKeeper() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LeaseKeeper::add(const std::string& key, std::chrono::seconds ttl, bool dir) {
  {
    std::lock_guard lock(mu_);
    leases_[key] = Lease{ttl, dir, std::chrono::steady_clock::now() + ttl / 2};
  }
  cv_.notify_all();
}

void LeaseKeeper::remove(const std::string& key) {
  std::lock_guard lock(mu_);
  leases_.erase(key);
}

void LeaseKeeper::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    auto now = std::chrono::steady_clock::now();
    auto next = now + std::chrono::hours(1);
    std::string due;
    Lease lease{};
    for (auto& [key, l] : leases_) {
      if (l.next <= now && due.empty()) {
        due = key;
        lease = l;
      }
      next = std::min(next, l.next);
    }
    if (due.empty()) {
      cv_.wait_until(lock, next);
      continue;
    }
    leases_[due].next = now + lease.ttl / 2;
    lock.unlock();
    bool gone = false;
    try {
      client_->write(
          due, "",
          WriteOptions{.prev_exist = true, .ttl = lease.ttl.count(), .dir = lease.dir, .refresh = true});
    } catch (const EtcdKeyError& e) {
      gone = e.code() == kKeyNotFound;
      if (!gone) spdlog::warn("etcd: refreshing {} failed: {}", due, e.what());
    } catch (const StoreError& e) {
      spdlog::warn("etcd: refreshing {} failed: {}", due, e.what());
    }
    lock.lock();
    if (gone) leases_.erase(due);
  }
}

}  // namespace ddprun::rdzv::etcd
