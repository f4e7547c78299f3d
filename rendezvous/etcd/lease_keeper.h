// LeaseKeeper: keeps etcd keys with a TTL alive from a thread of its own, as torch's etcd rendezvous does
// with one thread per key (setup_lease_renewal): each key is refreshed every TTL/2. A key that is gone
// (expired, deleted) is dropped; a refresh that fails for any other reason (etcd unreachable) is tried again
// at the next tick, and the key expires if etcd stays away longer than its TTL — what torch's peers expect.
// Threads: add/remove from any thread; the destructor stops and joins the thread. Never throws from the
// thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "rendezvous/etcd/etcd_client.h"

namespace ddprun::rdzv::etcd {

class LeaseKeeper {
 public:
  // `client` is used by this thread only.
  explicit LeaseKeeper(std::unique_ptr<Client> client);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Refreshes `key` (a directory when `dir`) to `ttl` every ttl/2 from now on.
  void add(const std::string& key, std::chrono::seconds ttl, bool dir);
  // Stops refreshing `key` (it expires by itself unless deleted).
  void remove(const std::string& key);

 private:
  struct Lease {
    std::chrono::seconds ttl;
    bool dir = false;
    std::chrono::steady_clock::time_point next;
  };
  void run();

  std::unique_ptr<Client> client_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Lease> leases_;  // guarded by mu_
  bool stop_ = false;                    // guarded by mu_
  std::thread thread_;
};

}  // namespace ddprun::rdzv::etcd
