// RoundKeys: the store keys and steps both rendezvous backends share. Keys are named here without the leading
// "/" that StoreClient adds to every key: key("closed") is "ddprun/<run_id>/closed", stored (and sent on the
// wire) as "/ddprun/<run_id>/closed".
//
//   r<round>/stop      RoundStop, written once by compare_set: the first stop of a round wins
//   r<round>/done      ADD counter of nodes whose workers all succeeded; the last one stops the round (kDone)
//   r<round>/left      ADD counter of nodes leaving; the last one sets r<round>/left_all
//   closed             the job is over: late agents must exit
//   status/n, status/<i>, status/<identity>   `ddprun status` (launcher/status/job_status.h): how many agents
//                      registered, the identity of the i-th, and each agent's status document (JSON)
// and, outside the run's namespace, "/ddprun/worker_keyspace": the workers' keyspace (KeyValueState), which
// the node completing a round opens before any node can start that round's workers. Stateless apart from the
// run id; every method is one to three store requests and may throw StoreError (BadReplyError when a round's
// stop is unreadable); the handlers translate it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/rendezvous_handler.h"

namespace ddprun::rdzv {

// Which of `keys` exist: one CHECK for them all, halves checked again only where one is missing (a GET or
// MULTI_GET would wait for a missing key), so that keys that all exist cost one request. Throws StoreError.
std::vector<bool> keys_present(Store& store, const std::vector<std::string>& keys);

class RoundKeys {
 public:
  explicit RoundKeys(std::string run_id) : run_id_(std::move(run_id)) {}

  const std::string& run_id() const { return run_id_; }

  std::string key(const std::string& k) const { return "ddprun/" + run_id_ + "/" + k; }
  std::string round_key(int round, const std::string& k) const {
    return key("r" + std::to_string(round) + "/" + k);
  }

  // Publishes `stop` unless the round already stopped; returns the stop that won.
  RoundStop stop(Store& store, int round, const RoundStop& stop) const;
  // Waits up to `timeout` for the round's stop (nullopt when the WAIT timed out; a store that does not answer
  // is a TimeoutError).
  std::optional<RoundStop> wait_stopped(Store& store, int round, std::chrono::milliseconds timeout) const;
  // The stop of a round that has stopped (its key set).
  RoundStop stopped(Store& store, int round) const;
  // Counts this node done; the last of `nodes` stops the round as kDone.
  void done(Store& store, int round, int nodes, int node_rank) const;
  void set_closed(Store& store) const { store.set(key("closed"), "1"); }
  // Gives the workers of `round` a keyspace of their own: no key of an earlier attempt is visible to them.
  // Must be called before the round's completion is published (its workers start after that).
  void open_worker_keyspace(Store& store, int round) const;
  bool is_closed(Store& store) const { return store.check({key("closed")}); }
  // Publishes `identity`'s status document; the first call (registered false) also registers the identity
  // in the status index (status/n, status/<i>) and sets `registered`. One request after the first.
  void publish_status(Store& store, const std::string& identity, const std::string& doc,
                      bool& registered) const;
  // A place in the status index and the agent it names.
  struct StatusSlot {
    int64_t index = 0;
    std::string identity;
  };
  // The status index (status/n slots, at most kMaxStatusSlots read), without the slots that name nobody
  // (missing, emptied by prune_status, or repeating an identity): a few requests.
  static constexpr int64_t kMaxStatusSlots = 1 << 20;
  std::vector<StatusSlot> status_slots(Store& store) const;
  // Removes an agent's status document and empties its slot (compare-and-set: a slot someone else took
  // meanwhile stays theirs).
  void prune_status(Store& store, const StatusSlot& slot) const;
  // The identities in the status index, in the order they registered (empty: none; up to three requests),
  // and their documents: "" for an identity whose document is missing (one CHECK and one MULTI_GET when every
  // document is there; a stranger can register an identity without one).
  std::vector<std::string> status_identities(Store& store) const;
  std::vector<std::string> status_documents(Store& store, const std::vector<std::string>& identities) const;
  // The job-wide straggler report (status/stragglers; agent/observe/straggler_watch.h): published by the
  // agent of node rank 0, read by `ddprun status` (nullopt: none published).
  void publish_stragglers(Store& store, const std::string& doc) const {
    store.set(key("status/stragglers"), doc);
  }
  std::optional<std::string> stragglers(Store& store) const;
  // Counts this node out of the round; the store host (`wait`) then waits up to 10 s until every node has
  // left, so that nobody loses the store in the middle of reading the round's end. Never throws.
  void leave(Store& store, int round, int nodes, bool wait) const;

 private:
  std::string run_id_;
};

}  // namespace ddprun::rdzv
