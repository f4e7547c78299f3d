// RendezvousHandler: how the agents of one job meet, agree on node ranks, and coordinate a round.
//
// Mirrors torch.distributed.elastic's RendezvousHandler. A round is one attempt of the job: every agent
// calls next_rendezvous(), which returns when the round is complete (all nodes joined), with this node's
// rank and the store that the round's keys live in. Within a round, any node can end it for everyone with
// stop_round() (a failure, or all nodes done); wait_round_stopped() lets every agent learn that at once.
//
// Implementations: StaticRendezvous (fixed node count, node 0 hosts the store) and DynamicRendezvous (c10d:
// MIN:MAX nodes, heartbeats). Threads: next_rendezvous and the round methods are called by the agent loop;
// wait_round_stopped may run on a second thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/rendezvous_error.h"
#include "rendezvous/store/store.h"
#include "rendezvous/store/store_auth.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_stats.h"

namespace ddprun::rdzv {

struct RendezvousInfo {
  int round = 0;             // 0 for the first round, +1 per new round (failure or membership change)
  int group_rank = 0;        // this node's rank in the round
  int group_world_size = 1;  // nodes in the round
  int base_rank = 0;         // global rank of this node's local rank 0
  int world_size = 1;        // workers in the round, all nodes together
  std::string store_host;    // where workers find the agent store (MASTER_ADDR)
  uint16_t store_port = 0;   // (MASTER_PORT)
  // true: an agent's store serves the workers there (TORCHELASTIC_USE_AGENT_STORE=True); false: the workers'
  // rank 0 hosts their TCPStore there, as under torchrun's etcd backends (a free port of node 0's host).
  bool agent_store = true;
  // Members of the previous round that are not in this one (their identities; c10d backend only): lost, or
  // too late. A restart their loss caused is given back (AgentLoop).
  std::vector<std::string> dropped_nodes;

  // The global rank of this node's worker `local_rank`.
  int rank_of(int local_rank) const { return base_rank + local_rank; }
};

// Where the workers of each node sit among all the workers of a round, when node i (in node-rank order) runs
// local_world_sizes[i] of them: node i's base rank is the count of the workers of the nodes before it, the
// world size the count of them all. Both backends assign ranks so.
struct RankLayout {
  std::vector<int> base_ranks;  // index = node rank
  int world_size = 0;
};
inline RankLayout rank_layout(const std::vector<int>& local_world_sizes) {
  RankLayout layout;
  for (int n : local_world_sizes) {
    layout.base_ranks.push_back(layout.world_size);
    layout.world_size += n;
  }
  return layout;
}

// How to reach a job's store (RendezvousHandler::observer_store).
struct StoreAccess {
  std::string host;
  uint16_t port = 0;
  std::shared_ptr<const StoreAuth> auth;  // the job's credentials; null: an open store
  std::string run_id;
  std::string identity;  // this agent's name in the status keys
};

// Why a round ended, as published by stop_round (first caller wins).
struct RoundStop {
  // kDone: every node succeeded. kFailed: a worker failed (counts against --max_restarts). kShutdown: a node
  // got a signal (no restart). kMembership: a node arrived or died; survivors restart without counting.
  enum class Kind { kDone, kFailed, kShutdown, kMembership } kind = Kind::kDone;
  int node_rank = -1;  // who stopped it
  std::string detail;  // free text (failing rank and exit code)
  int exit_code = 0;   // the root-cause worker's exit code (kFailed)
};

// Errors: every method throws only RendezvousError subclasses (rendezvous_error.h), listed per method below,
// and std::bad_alloc. A StoreError from the store is translated at this boundary into RendezvousStoreError
// whose message keeps the store's own words (store_failure). Implementations override the do_* methods; the
// public ones translate. Constructors of implementations are the exception: they throw BindError (the store
// this agent must host cannot listen: addr:port in use or not an address of this machine) and
// RendezvousStoreError (the store cannot be reached, or does not answer, within the connect timeout).
class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;

  // Joins the next round with `local_world_size` workers; blocks until it is complete.
  // RendezvousClosedError: the job already finished. RendezvousTimeoutError: too few nodes within
  // join_timeout, or the store's host gave up first. RendezvousConflictError: this agent's node rank is
  // taken, or it waited as a spare of another job that reused this run id and endpoint. RendezvousStoreError:
  // the store is unreachable, silent for longer than a request's timeout, or holds unreadable rendezvous
  // data.
  RendezvousInfo next_rendezvous(int local_world_size) {
    return guard([&] { return do_next_rendezvous(local_world_size); });
  }
  // Ends the current round for everyone; returns the stop that won (maybe another node's).
  // RendezvousStoreError.
  RoundStop stop_round(const RoundStop& stop) {
    return guard([&] { return do_stop_round(stop); });
  }
  // Blocks until the current round is stopped (returns the stop) or `timeout` passes (nullopt). A store that
  // stalls or drops the connection is retried for as long as the handler tolerates (its stall tolerance; see
  // the implementations); a call may then overrun `timeout` by one request timeout of the watcher.
  // RendezvousStoreError: "the store at H:P did not answer for N s" once the tolerance is exceeded, at once
  // when the store sends something unreadable.
  std::optional<RoundStop> wait_round_stopped(std::chrono::milliseconds timeout) {
    return guard([&] { return do_wait_round_stopped(timeout); });
  }
  // Tells the round this node's workers all succeeded; the last node to do so stops the round as kDone.
  // RendezvousStoreError.
  void node_done() {
    guard([&] { do_node_done(); });
  }
  // Marks the rendezvous closed (job finished) so late agents exit. RendezvousStoreError.
  void set_closed() {
    guard([&] { do_set_closed(); });
  }
  // RendezvousStoreError.
  bool is_closed() {
    return guard([&] { return do_is_closed(); });
  }
  virtual const std::string& run_id() const = 0;
  // Releases the store (the store host keeps serving until the handler is destroyed). May throw
  // RendezvousStoreError; StaticRendezvous and DynamicRendezvous never throw here.
  void shutdown() {
    guard([&] { do_shutdown(); });
  }
  // This node's workers caused the failure that ended the round (for the dynamic backend's cooldown).
  // RendezvousStoreError.
  void note_local_failure() {
    guard([&] { do_note_local_failure(); });
  }
  // Called when a local worker failed, after the local group was told to stop and before the failure is
  // published: the node ranks of the round whose agents the backend knows gone (a dead node's peers see its
  // loss first as collective errors). Reads what the store knows and never waits: a few store requests.
  // Empty when every node looks alive or the backend has no liveness information. RendezvousStoreError.
  std::vector<int> lost_nodes() {
    return guard([&] { return do_lost_nodes(); });
  }
  // This node is unhealthy (agent/health/health_check.h) and does not join now: the next round may close
  // without it (where a spare or MIN < MAX allows), and `reason` is recorded for the job to see. The next
  // next_rendezvous() joins again (as a spare when the job is full). RendezvousStoreError.
  void stand_aside(const std::string& reason) {
    guard([&] { do_stand_aside(reason); });
  }
  // The statistics of the store this agent hosts (for its metrics); nullopt when it hosts none. Never throws.
  virtual std::optional<StoreServerStats> hosted_store_stats() { return std::nullopt; }
  // Where what the job shows is kept (agent/observe/: status documents, the straggler report): the job's
  // store as this node reaches it now — after a failover, the standby — with the job's credentials, and this
  // agent's identity in the status keys (RoundKeys::publish_status). nullopt where the job has no ddprun
  // store (etcd backends). The caller opens a connection of its own, on its own thread, so that its requests
  // never wait behind the rendezvous' or hold up the agent loop; the handler does no observability I/O.
  // Thread-safe; never blocks; never throws but std::bad_alloc.
  virtual std::optional<StoreAccess> observer_store() const { return std::nullopt; }

 protected:
  virtual RendezvousInfo do_next_rendezvous(int local_world_size) = 0;
  virtual RoundStop do_stop_round(const RoundStop& stop) = 0;
  virtual std::optional<RoundStop> do_wait_round_stopped(std::chrono::milliseconds timeout) = 0;
  virtual void do_node_done() = 0;
  virtual void do_set_closed() = 0;
  virtual bool do_is_closed() = 0;
  virtual void do_shutdown() = 0;
  virtual void do_note_local_failure() {}
  virtual std::vector<int> do_lost_nodes() { return {}; }
  virtual void do_stand_aside(const std::string& /*reason*/) {}
  // The error reported for a StoreError that reached the boundary: "rendezvous '<run_id>': <what>".
  // Implementations that know their store's endpoint make sure the message names it.
  virtual RendezvousStoreError store_failure(const StoreError& e) const {
    return RendezvousStoreError("rendezvous '" + run_id() + "': " + e.what());
  }

 private:
  template <typename F>
  auto guard(F f) -> decltype(f()) {
    try {
      return f();
    } catch (const StoreError& e) {
      throw store_failure(e);
    }
  }
};

// Encoding of RoundStop in the store: "<kind>|<node_rank>|<exit_code>|<detail>", the numbers in plain
// decimal. decode_round_stop refuses anything but exactly what encode_round_stop writes (a number with a sign
// "+", leading zeros, spaces or trailing characters included); the detail is free text (bars allowed).
std::string encode_round_stop(const RoundStop& stop);
std::optional<RoundStop> decode_round_stop(std::string_view text);

}  // namespace ddprun::rdzv
