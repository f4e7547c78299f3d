// RendezvousHandler: how the agents of one job meet, agree on node ranks, and coordinate a round.
//
// Mirrors torch.distributed.elastic's RendezvousHandler. A round is one attempt of the job: every agent
// calls next_rendezvous(), which returns when the round is complete (all nodes joined), with this node's
// rank and the store that the round's keys live in. Within a round, any node can end it for everyone with
// stop_round() (a failure, or all nodes done); wait_round_stopped() lets every agent learn that at once.
//
// Implementations: StaticRendezvous (fixed node count, node 0 hosts the store). Threads: next_rendezvous and
// the round methods are called by the agent loop; wait_round_stopped may run on a second thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/store.h"
#include "rendezvous/store_error.h"

namespace ddprun::rdzv {

// The job's rendezvous is closed: it finished, and late agents must exit.
class RendezvousClosedError : public StoreError {
 public:
  using StoreError::StoreError;
};

// Not enough nodes joined within the join timeout. The message names who joined and the endpoint.
class RendezvousTimeoutError : public StoreError {
 public:
  using StoreError::StoreError;
};

struct RendezvousInfo {
  int round = 0;             // 0 for the first round, +1 per new round (failure or membership change)
  int group_rank = 0;        // this node's rank in the round
  int group_world_size = 1;  // nodes in the round
  int base_rank = 0;         // global rank of this node's local rank 0
  int world_size = 1;        // workers in the round, all nodes together
  std::string store_host;    // where workers find the agent store (MASTER_ADDR)
  uint16_t store_port = 0;   // (MASTER_PORT)
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

class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;

  // Joins the next round with `local_world_size` workers; blocks until it is complete.
  // Throws RendezvousTimeoutError, RendezvousClosedError, or StoreError on network trouble.
  virtual RendezvousInfo next_rendezvous(int local_world_size) = 0;
  // Ends the current round for everyone; returns the stop that won (maybe another node's).
  virtual RoundStop stop_round(const RoundStop& stop) = 0;
  // Blocks until the current round is stopped or `timeout` passes (nullopt).
  virtual std::optional<RoundStop> wait_round_stopped(std::chrono::milliseconds timeout) = 0;
  // Tells the round this node's workers all succeeded; the last node to do so stops the round as kDone.
  virtual void node_done() = 0;
  // Marks the rendezvous closed (job finished) so late agents exit.
  virtual void set_closed() = 0;
  virtual bool is_closed() = 0;
  virtual const std::string& run_id() const = 0;
  // Releases the store (the store host keeps serving until the handler is destroyed).
  virtual void shutdown() = 0;
  // This node's workers caused the failure that ended the round (for the dynamic backend's cooldown).
  virtual void note_local_failure() {}
  // Called when a local worker failed, before the failure is published: the node ranks of the round that
  // look dead (a dead node's peers see its loss first as collective errors). Blocks up to about one
  // heartbeat interval. Empty when every node is alive or the backend has no liveness information.
  virtual std::vector<int> unresponsive_nodes() { return {}; }
};

// Encoding of RoundStop in the store (pure; tested).
std::string encode_round_stop(const RoundStop& stop);
std::optional<RoundStop> decode_round_stop(std::string_view text);

}  // namespace ddprun::rdzv
