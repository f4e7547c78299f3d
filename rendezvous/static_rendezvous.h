// StaticRendezvous: a fixed number of nodes, known ranks, node 0's agent hosts the store.
//
// torchrun's static backend (`--nnodes N --node_rank R --master_addr A --master_port P`), plus what torchrun
// lacks: rounds are coordinated through the store, so a failure on one node restarts the group on every
// node with the same attempt number. Keys (all under "/ddprun/<run_id>/", see docs/rendezvous.md):
//   r<round>/joined      ADD counter; the node that brings it to N sets r<round>/complete
//   r<round>/lws/<node>  that node's local world size
//   r<round>/stop        RoundStop, written once by compare_set (first stop wins)
//   r<round>/done        ADD counter of nodes whose workers all succeeded
//   closed               set when the job is over
// Every step costs each node O(1) messages; nodes block in WAIT (no polling); progress is logged while
// waiting. Thread-safety: wait_round_stopped() may be called from one other thread concurrently with the
// agent loop (it uses its own connection).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/round_keys.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"

namespace ddprun::rdzv {

struct StaticRendezvousOptions {
  std::string run_id = "none";
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;  // 0 with host_store: pick a free port (standalone)
  bool host_store = false;       // this agent runs the store (node 0)
  std::string bind_host;         // where the hosted store listens ("" = every interface)
  std::chrono::milliseconds join_timeout{600000};
  std::chrono::milliseconds connect_timeout{600000};
  std::chrono::milliseconds progress_interval{5000};
};

class StaticRendezvous final : public RendezvousHandler {
 public:
  // Starts the store when host_store (throws BindError naming addr:port) and connects to it
  // (TimeoutError naming the endpoint when it cannot be reached within connect_timeout).
  explicit StaticRendezvous(StaticRendezvousOptions options);
  ~StaticRendezvous() override;

  RendezvousInfo next_rendezvous(int local_world_size) override;
  RoundStop stop_round(const RoundStop& stop) override;
  std::optional<RoundStop> wait_round_stopped(std::chrono::milliseconds timeout) override;
  void node_done() override;
  void set_closed() override;
  bool is_closed() override;
  const std::string& run_id() const override { return options_.run_id; }
  void shutdown() override;

  uint16_t store_port() const { return port_; }
  std::shared_ptr<StoreClient> store() { return store_; }

 private:
  std::string key(const std::string& k) const { return keys_.key(k); }
  std::string round_key(int round, const std::string& k) const { return keys_.round_key(round, k); }

  StaticRendezvousOptions options_;
  RoundKeys keys_;
  std::unique_ptr<StoreServerThread> server_;
  uint16_t port_ = 0;
  std::shared_ptr<StoreClient> store_;     // agent loop's connection
  std::unique_ptr<StoreClient> watcher_;   // wait_round_stopped's connection
  std::atomic<int> round_{-1};
};

}  // namespace ddprun::rdzv
