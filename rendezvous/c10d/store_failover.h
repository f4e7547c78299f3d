// StoreFailover: how the agents of an elastic (c10d) job outlive the agent that hosts their store.
//
// Standby stores. Every agent that does not host the job's store keeps a standby: an empty StoreServer on
// the port of its host's entry in --rdzv_endpoint's list when there is one (when that port is taken, the
// agent keeps no standby and says so: a standby never moves off its listed port, where a stranger could stand
// in for it), else on a free port, preset with the key "standby". The agent advertises it as "<its
// address>:<port>" in its node descriptor (its address:
// --local_addr, else the address its host reaches the store from), and the node that closes a round lists
// the standbys of the first kSuccessors nodes in node-rank order: the round's successors, which every member
// reads with its rank assignment.
//
// Loss. The store is lost when nothing listens at its endpoint any more (connection refused: its process is
// gone while its host's kernel answers), or when it has not answered for the heartbeat timeout
// (keep_alive_interval x keep_alive_max_attempt: its host or its network is gone, or it is frozen for longer
// than a node may be). A store that answers again within the heartbeat timeout was not lost: a frozen store
// host is never taken for a lost one before a node would be.
//
// Take-over. Each survivor walks the successors in order. Its own standby: it takes over (sets "active" to
// the lost endpoint) and hosts the job from now on. Another node's: when that node is reachable, the survivor
// waits up to the close timeout for it to take over (it notices the loss about as fast); refused, silent, or
// never taking over: the next successor. Survivors that see the same successors alive pick the same store
// without talking to each other; the new round then forms there as after any node loss (not a restart).
// Guaranteed: any number of crash-stopped nodes, the store host included, as long as one of the round's
// successors survives. Not guaranteed: a network partition that shows survivors different successors alive
// (each side forms its own job), and a successor frozen during the take-over.
//
// Discovery. A node that comes later, or a store host that was frozen past the heartbeat timeout, finds where
// the job went: find_job() over --rdzv_endpoint's comma-separated list (a standby that never took over does
// not count), moved_to() over the successors it knew.
//
// Keys (run namespace, see round_keys.h): "standby" (preset in a standby store), "active" (the endpoint the
// store took over from). Threads: one agent loop calls everything; the standby's server has its own thread.
// Every method that talks to a peer bounds each step by the timeouts named in its comment.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/round_keys.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_auth.h"
#include "rendezvous/store/store_server.h"

namespace ddprun::rdzv {

class StoreFailover {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kSuccessors = 4;  // per round: enough for three more losses during one take-over

  // heartbeat_timeout: how long a silent store counts as alive. takeover_timeout: how long survivors wait for
  // a reachable successor to take over (the close timeout).
  // `auth`: the job's secret for the standby store and every connection (null: none).
  StoreFailover(const RoundKeys& keys, std::chrono::milliseconds heartbeat_timeout,
                std::chrono::milliseconds takeover_timeout, std::shared_ptr<const StoreAuth> auth = nullptr);
  ~StoreFailover();

  // Starts this agent's standby store on `port` (0: a free port), advertised as address:port, with
  // `memory_budget` (StoreServerOptions::memory_budget; 0: the default), listening on `bind_host` only ("":
  // every interface), calling `on_key_released` (StoreServerOptions::on_connection_key_released; may be
  // empty). A listed `port` that cannot be bound leaves this agent without a standby (standby() stays "",
  // standby_port() 0, an error logged). Throws BindError when port 0 cannot be bound.
  void start_standby(const std::string& address, uint16_t port, size_t memory_budget = 0,
                     const std::string& bind_host = "",
                     std::function<void(const std::string&)> on_key_released = {});
  // "addr:port" of the standby store; "" when this agent has none (it hosts the job's store).
  const std::string& standby() const { return standby_; }
  // Its port (0: none).
  uint16_t standby_port() const { return standby_server_ ? standby_server_->port() : 0; }

  // The successors of a round as the closer stores them: "<members without a standby>|<ep>,<ep>,...", and
  // back (nullopt when the text is not that).
  struct Successors {
    int without_standby = 0;  // members that cannot take over: the store host (and agents with failover off)
    std::vector<Endpoint> endpoints;
  };
  static std::string encode(const Successors& s);
  static std::optional<Successors> decode(std::string_view text);

  // Whether the store at `store`, whose request just failed, is lost: true at once when nothing listens
  // there; false as soon as it answers a fresh connection again; true when it stays silent past
  // `silent_since` + the heartbeat timeout. Blocks until one of those (probes of at most 1 s each).
  bool lost(const Endpoint& store, Clock::time_point silent_since) const;

  struct NewStore {
    Endpoint endpoint;
    std::unique_ptr<StoreServerThread> server;  // this agent's standby, when it is the new store
    int skipped = 0;                            // successors passed over (gone, silent, never took over)
  };
  // Where the survivors of the store at `lost` meet (see the header comment). Probes take up to 2 s each;
  // waiting for a reachable successor up to the takeover timeout. Throws RendezvousStoreError naming every
  // successor tried and why it was passed over.
  NewStore take_over(const std::vector<Endpoint>& successors, const std::string& lost);
  // The successor that took over from `lost`, if one of them answers within 1 s (for a store host that was
  // unreachable for longer than the heartbeat timeout: its job may have moved on without it).
  std::optional<Endpoint> moved_to(const std::vector<Endpoint>& successors, const std::string& lost) const;
  // The first of `endpoints` whose store serves a job under this run id (a standby that never took over does
  // not), each probed within 1 s.
  std::optional<Endpoint> find_job(const std::vector<Endpoint>& endpoints) const;

 private:
  std::string wire_key(const std::string& k) const { return "/" + keys_.key(k); }

  RoundKeys keys_;
  std::shared_ptr<const StoreAuth> auth_;
  std::string standby_bind_;  // the standby's bind address ("": every interface, reached on 127.0.0.1)
  std::chrono::milliseconds heartbeat_timeout_;
  std::chrono::milliseconds takeover_timeout_;
  std::unique_ptr<StoreServerThread> standby_server_;
  std::string standby_;
};

}  // namespace ddprun::rdzv
