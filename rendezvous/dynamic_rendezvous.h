// DynamicRendezvous: torchrun's c10d backend on ddprun's store — elastic node counts (--nnodes MIN:MAX),
// node loss and node arrival, with rounds that cost O(N) messages in total.
//
// Protocol (docs/rendezvous.md has the sequence diagram). Keys under "/ddprun/<run_id>/":
//   round                 the newest round that completed (decimal)
//   r<r>/joined           ADD counter: a joining node's arrival index is the value it gets back, minus one
//   r<r>/node/<idx>       the node's descriptor "<identity>|<previous node rank>|<local world size>"
//   r<r>/full             set by the node that arrives as number MAX: ends the last call at once
//   r<r>/closed           the number of nodes in the round, written once (compare_set) by the closer
//   r<r>/assign/<idx>     "<node rank>|<nodes>|<base rank>|<world size>", written by the closer (multi_set)
//   r<r>/stop             RoundStop (first writer wins); r<r>/done, r<r>/left: counters as in the static backend
//   r<r>/hb/<node rank>   heartbeat counter of a running node (ADD 1 every keep_alive_interval)
//   failures/<host>       how often this host's workers caused a failure (cooldown)
//   closed                the job is over
// Completion: the node whose arrival makes the count MIN waits up to last_call_timeout for more (or for
// r<r>/full), then closes the round with the count it reads; every other node waits for r<r>/closed, and
// closes it itself if the closer vanished. Only the closer reads the descriptors (one MULTI_GET) and assigns
// node ranks deterministically (nodes of the previous round keep their order, newcomers follow, sorted by
// identity); each node then WAITs for its own assignment. A node arriving after the close: if the round has
// room it ends the round (kMembership) so that everyone re-joins a bigger one; else it waits for the round to
// end (RendezvousClosedError when it ends as kDone or the store goes away: the job finished, so this agent
// reused a running job's run id). A store lost while waiting for a round to complete is a
// RendezvousTimeoutError naming the endpoint: its host gave up, usually at its own join timeout. Liveness:
// each running node bumps its heartbeat and watches the next node's (ring order) with its own monotonic clock
// — no wall clocks are compared across hosts; a neighbour silent for keep_alive_interval ×
// keep_alive_max_attempt is declared dead (kMembership), and the survivors re-join.
//
// Threads: the agent loop calls next_rendezvous/stop_round/node_done; its watcher thread calls
// wait_round_stopped, which also sends the heartbeats. Each uses its own connection.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/round_keys.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"

namespace ddprun::rdzv {

struct DynamicRendezvousOptions {
  std::string run_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  std::string endpoint_host = "localhost";
  uint16_t endpoint_port = 29400;
  // Host the store: explicitly (is_host=1/0) or, when unset, if the endpoint is an address of this machine.
  std::optional<bool> is_host;
  std::string identity;  // unique per agent; default "<hostname>:<pid>"
  std::string host;      // this node's host name, for cooldown bookkeeping; default gethostname()
  std::chrono::milliseconds join_timeout{600000};
  std::chrono::milliseconds last_call_timeout{30000};
  std::chrono::milliseconds close_timeout{30000};
  std::chrono::milliseconds keep_alive_interval{5000};
  int keep_alive_max_attempt = 3;
  std::chrono::milliseconds read_timeout{60000};
  std::chrono::milliseconds progress_interval{5000};
  std::chrono::milliseconds cooldown_base{10000};  // a host that failed twice sits out this long, doubling
  std::chrono::milliseconds cooldown_max{300000};
};

// Ranks for one round (pure; tested): `previous[i]` is node i's rank in the previous round or -1.
// Returns the node rank of each arrival index.
std::vector<int> order_nodes(const std::vector<std::string>& identities, const std::vector<int>& previous);

// True when `host` names or resolves to an address of this machine (loopback included).
bool is_local_host(const std::string& host);

class DynamicRendezvous final : public RendezvousHandler {
 public:
  // Starts the store when this node hosts it, then connects (TimeoutError naming the endpoint when it
  // cannot be reached within join_timeout).
  explicit DynamicRendezvous(DynamicRendezvousOptions options);
  ~DynamicRendezvous() override;

  RendezvousInfo next_rendezvous(int local_world_size) override;
  RoundStop stop_round(const RoundStop& stop) override;
  std::optional<RoundStop> wait_round_stopped(std::chrono::milliseconds timeout) override;
  void node_done() override;
  void set_closed() override;
  bool is_closed() override;
  const std::string& run_id() const override { return options_.run_id; }
  void shutdown() override;
  void note_local_failure() override;
  std::vector<int> unresponsive_nodes() override;

  bool hosts_store() const { return server_ != nullptr; }
  // The store's port: the endpoint's, or the one picked when this node hosts the store on port 0.
  uint16_t store_port() const { return options_.endpoint_port; }

 private:
  std::string key(const std::string& k) const { return keys_.key(k); }
  std::string round_key(int round, const std::string& k) const { return keys_.round_key(round, k); }
  int current_round();
  // Waits until round r is closed (closing it when this node runs the last call or the closer vanished).
  void wait_closed_or_close(int r, int64_t index);
  RoundStop stop_round_at(int round, const RoundStop& stop);
  void sit_out_if_failing();
  void heartbeat_and_check();

  DynamicRendezvousOptions options_;
  RoundKeys keys_;
  std::unique_ptr<StoreServerThread> server_;
  std::shared_ptr<StoreClient> store_;
  std::unique_ptr<StoreClient> watcher_;
  std::atomic<int> round_{-1};
  int rank_ = -1;
  int nodes_ = 0;
  int previous_rank_ = -1;
  // Heartbeat state, watcher thread only.
  std::chrono::steady_clock::time_point next_beat_{};
  int64_t neighbour_beats_ = -1;
  std::chrono::steady_clock::time_point neighbour_seen_{};
};

}  // namespace ddprun::rdzv
