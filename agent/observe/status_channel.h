// StatusChannel: the observer's connection to the job's store, on a thread of its own (agent/observe/
// observer.h). The agent loop posts its newest status document with where the store is
// (RendezvousHandler::observer_store) and goes on at once; the thread publishes it
// (RoundKeys::publish_status: the document, and the first time on each store its place in the status index).
// A document not yet taken when a newer one is posted is replaced by it: only the newest matters.
//
// On node rank 0 of the running round, after its own document, the thread also makes the job-wide straggler
// report (straggler_watch.h) when due: it reads every agent's document, publishes the report when it
// changed, and keeps the episodes for the loop (take_episodes). And once a minute it removes the documents
// of agents that left the job more than kPruneAge ago (prune()), so that the index of a long elastic job
// names the agents that matter, not every agent that ever ran.
//
// A store that stalls or is gone costs this thread, never the loop: its requests wait at most kRequestTimeout
// and a failure drops the connection (logged at debug level: the status is best effort), to be made again
// for the next post. Threads: post, take_episodes, flagged and flush from any one thread (the loop); the
// destructor waits for a request under way (at most kRequestTimeout). Never throws but std::bad_alloc.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/observe/straggler_watch.h"
#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/store/store.h"

namespace ddprun::agent {

constexpr std::chrono::milliseconds kObserverRequestTimeout{2000};
constexpr std::chrono::seconds kPruneInterval{60};
constexpr std::chrono::seconds kPruneAge{600};

struct StatusPost {
  rdzv::StoreAccess access;
  std::string document;
  // The running round as this agent sees it (round < 0: none), for the straggler report.
  int round = -1, node_rank = -1, nodes = 0;
};

class StatusChannel {
 public:
  // straggler_factor 0: no straggler report. prune_interval: kPruneInterval (tests: shorter).
  explicit StatusChannel(double straggler_factor, std::chrono::milliseconds prune_interval = kPruneInterval);
  ~StatusChannel();
  StatusChannel(const StatusChannel&) = delete;
  StatusChannel& operator=(const StatusChannel&) = delete;

  void post(StatusPost post);
  // The straggler episodes that began or ended since the last call (node rank 0 only), oldest first.
  std::vector<StragglerEpisode> take_episodes();
  // The ranks flagged now (node rank 0 only).
  std::map<int, StragglerEpisode> flagged() const;
  // Waits until every post so far was handled (published, or failed), at most `timeout`; true when so.
  bool flush(std::chrono::milliseconds timeout);

 private:
  void run();
  // On the thread, without the lock: publishes `p`, then the straggler report when due.
  void publish(const StatusPost& p);
  void report_stragglers(const StatusPost& p, rdzv::Store& store);
  void prune(const StatusPost& p, rdzv::Store& store);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<StatusPost> next_;           // guarded by mu_
  uint64_t posted_ = 0, handled_ = 0;        // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::vector<StragglerEpisode> episodes_;   // guarded by mu_
  std::map<int, StragglerEpisode> flagged_;  // guarded by mu_

  // The thread's own.
  StragglerWatch watch_;
  std::unique_ptr<rdzv::Store> store_;
  std::string store_at_;                 // host:port of store_
  bool registered_ = false;              // in store_'s status index
  std::vector<std::string> identities_;  // the status index at its last read
  std::chrono::milliseconds prune_interval_;
  std::chrono::steady_clock::time_point next_prune_;

  std::thread thread_;  // last: started when everything above exists
};

}  // namespace ddprun::agent
