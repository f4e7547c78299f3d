// Replicator: the background copy of this node's training state to its buddy (the next node of the round,
// agent/state/state_peers.h). Whenever a worker commits a version (inotify on own/), the newest version of
// each of this node's ranks goes to the buddy's agent (agent/state/state_server.h) over TCP, paced by
// --state_bandwidth (agent/state/rate_limiter.h); a version superseded before its turn is skipped. A new
// buddy (a new round with another node next) gets the newest version of every rank at once.
//
// The buddy's address is in its round document in the job's store: the replicator's thread reads it with a
// store connection of its own (waiting up to kBuddyWait for the buddy to publish it), so the agent loop never
// waits for the buddy. A copy that fails (the buddy lost, refused, silent) is logged and tried again after a
// backoff (1 s doubling to 30 s), or with the next round's buddy.
//
// Threads: one thread of its own; set_target() and replicated() from any thread. The destructor stops the
// thread (a copy in progress is given up) and joins. Errors: none thrown after construction (which throws
// std::system_error when inotify or eventfd cannot be had).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/state/rate_limiter.h"
#include "agent/state/state_directory.h"
#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

class Replicator {
 public:
  static constexpr std::chrono::milliseconds kBuddyWait{60000};

  struct Target {
    rdzv::StoreAccess store;  // where the buddy's document is, and the job's credentials
    int round = 0;
    int buddy = 0;           // its node rank
    std::vector<int> ranks;  // this node's ranks in the round
  };
  struct Stats {
    std::map<int, int64_t> replicated;  // rank -> the newest step the buddy committed a copy of
    uint64_t copies = 0, bytes = 0, failures = 0;
  };

  Replicator(const StateDirectory& dir, uint64_t bandwidth);
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // From now on, the copies go to `target`'s buddy; nullopt: nowhere (a round of one node, or no store).
  void set_target(std::optional<Target> target);
  Stats stats() const;

 private:
  struct Sent {
    int64_t step = -1;
    uint64_t inode = 0;
    bool operator==(const Sent&) const = default;
  };

  void run();
  // Waits for a commit (when `until` is nullopt; else until then), a new target or the stop; false: stop.
  bool wait(std::optional<std::chrono::steady_clock::time_point> until);
  // --state_bandwidth's pause before a chunk: false when the agent stops meanwhile.
  bool sleep_until(std::chrono::steady_clock::time_point at);
  std::optional<rdzv::Endpoint> resolve(const Target& t);
  // One pass over the ranks; false when a copy failed (retry after the backoff).
  bool copy_new_versions(const Target& t, const rdzv::Endpoint& buddy);
  void copy(const rdzv::Endpoint& buddy, const StoredVersion& v, int fd, uint64_t bytes);
  void wake();

  const StateDirectory& dir_;
  RateLimiter limiter_;  // the thread's own
  UniqueFd inotify_;
  UniqueFd wake_;  // eventfd
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::optional<Target> target_;  // guarded by mu_
  uint64_t target_serial_ = 0;    // guarded by mu_: +1 per set_target
  Stats stats_;                   // guarded by mu_
  std::map<int, Sent> sent_;      // the thread's: what the current buddy has
  std::thread thread_;            // last
};

}  // namespace ddprun::agent
