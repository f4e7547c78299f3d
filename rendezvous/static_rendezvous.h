// StaticRendezvous: a fixed number of nodes, known ranks, node 0's agent hosts the store.
//
// torchrun's static backend (`--nnodes N --node_rank R --master_addr A --master_port P`), plus what torchrun
// lacks: rounds are coordinated through the store, so a failure on one node restarts the group on every
// node with the same attempt number. Keys (stored as "/ddprun/<run_id>/...", see round_keys.h and
// docs/rendezvous.md):
//   r<round>/node/<node>  the identity "<hostname>:<pid>" of the agent holding that node rank (compare_set)
//   r<round>/lws/<node>   that node's local world size
//   r<round>/joined       ADD counter; the node that brings it to N sets r<round>/complete
//   r<round>/stop, r<round>/done, r<round>/left, closed: as in round_keys.h
// Every step costs each node O(1) messages; nodes block in WAIT (no polling); progress is logged while
// waiting.
//
// Errors (beyond RendezvousHandler's contract): next_rendezvous throws RendezvousConflictError when another
// agent holds this --node_rank, and RendezvousTimeoutError when node 0's agent took the store away while this
// node waited. Stall tolerance: the watcher (wait_round_stopped) rides out a store that does not answer for
// up to connect_timeout, the time this agent keeps trying to reach the store at all; the agent loop's
// requests each wait up to join_timeout.
//
// A store lost while a round runs (the watcher's or stop_round's error) is said to end the job: the message
// adds that a fixed node count cannot outlive node 0 and points to the c10d backend, which can.
//
// Threads: see RendezvousBase (wait_round_stopped on one watcher thread, everything else on the agent loop).
#pragma once

#include "rendezvous/rendezvous_base.h"
#include "rendezvous/store/store_auth.h"

namespace ddprun::rdzv {

struct StaticRendezvousOptions {
  std::string run_id = "none";
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;    // 0 with host_store: pick a free port (standalone)
  bool host_store = false;         // this agent runs the store (node 0)
  std::string bind_host;           // where the hosted store listens ("" = every interface)
  size_t store_memory_budget = 0;  // the hosted store's StoreServerOptions::memory_budget (0: its default)
  std::shared_ptr<const StoreAuth> auth;  // the job's secret (--rdzv_secret_file; store_auth.h); null: none
  std::string advertised_addr;  // the workers' MASTER_ADDR (RendezvousInfo::store_host); "" = master_addr
  std::chrono::milliseconds join_timeout{600000};     // the round must complete in time; one request's limit
  std::chrono::milliseconds connect_timeout{600000};  // reaching the store; the watcher's stall tolerance
  std::chrono::milliseconds progress_interval{5000};
};

class StaticRendezvous final : public RendezvousBase {
 public:
  // Starts the store when host_store (BindError naming addr:port) and connects to it (RendezvousStoreError
  // naming the endpoint when it cannot be reached within connect_timeout).
  explicit StaticRendezvous(StaticRendezvousOptions options);
  ~StaticRendezvous() override;

 protected:
  RendezvousInfo do_next_rendezvous(int local_world_size) override;
  std::optional<RoundStop> do_wait_round_stopped(std::chrono::milliseconds timeout) override;
  RendezvousStoreError store_failure(const StoreError& e) const override;

 private:
  std::string round_key(int round, const std::string& k) const { return keys_.round_key(round, k); }
  // Takes this node's rank in round r (RendezvousConflictError when another agent holds it).
  void claim_node_rank(int r);
  // Waits until round r is complete (RendezvousTimeoutError at join_timeout, or when the store went away).
  void wait_complete(int r);
  // "1, 3" (at most 32 listed, then "and N more"): the node ranks that have not joined round r yet. One CHECK
  // per node.
  std::string missing_node_ranks(int r);
  static constexpr int kNamedInProgress = 32;  // progress lines name the missing ranks up to this many nodes
  RendezvousInfo round_info(int r);

  StaticRendezvousOptions options_;
};

}  // namespace ddprun::rdzv
