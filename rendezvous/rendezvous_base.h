// RendezvousBase: what StaticRendezvous and DynamicRendezvous share — the store this node hosts or joins, the
// two connections to it, the round this node is in, and the round steps that are the same in both backends:
// stop, done, closed, leave, and the watcher's wait for the end of the round with its stall tolerance.
//
// Connections: the agent loop's (`store_`: next_rendezvous, stop_round, node_done, ...; each request waits up
// to Timeouts::request) and the watcher thread's (`watcher_`: wait_round_stopped; short requests, so that a
// stalled store shows at once). The watcher rides out a store that does not answer, or cannot be reached, for
// up to Timeouts::stall_tolerance (StoreSilence), then reports RendezvousStoreError; every other method
// reports a store failure at once.
//
// Threads: the agent loop calls every method but wait_round_stopped, which one watcher thread may call
// concurrently; `round_` is atomic, `rank_` and `nodes_` are written by next_rendezvous before the agent
// starts its watcher thread.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/round_keys.h"
#include "rendezvous/store/store_auth.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store_silence.h"

namespace ddprun::rdzv {

class RendezvousBase : public RendezvousHandler {
 public:
  using Clock = std::chrono::steady_clock;

  ~RendezvousBase() override;

  const std::string& run_id() const override { return keys_.run_id(); }
  // The store's endpoint as this node reaches it ("addr:port").
  const std::string& endpoint() const { return endpoint_; }
  // The store's port: the one configured, or the one picked when this node hosts the store on port 0.
  uint16_t store_port() const { return port_; }
  bool hosts_store() const { return server_ != nullptr; }
  std::optional<StoreServerStats> hosted_store_stats() override;
  std::optional<StoreAccess> observer_store() const override;

 protected:
  struct Timeouts {
    std::chrono::milliseconds connect;          // how long connecting (or reconnecting) keeps trying
    std::chrono::milliseconds request;          // one request of the agent loop's connection
    std::chrono::milliseconds watcher_request;  // one request of the watcher's connection
    std::chrono::milliseconds stall_tolerance;  // how long the watcher rides out a silent store
    std::chrono::milliseconds reconnect{0};     // the agent loop's reconnections, once connected (0: connect)
    // The watcher's reconnections, once connected (0: watcher_request). Short, so that a store that refuses
    // connections shows at once (store_gone()); a silent one is still timed by the stall tolerance.
    std::chrono::milliseconds watcher_reconnect{0};
  };

  // `auth`: the job's secret (store_auth.h), for every store this node hosts and every connection it makes;
  // null: open stores.
  explicit RendezvousBase(std::string run_id, std::shared_ptr<const StoreAuth> auth = nullptr);

  // Starts the store this node hosts (with the job's secret); returns its port. Throws BindError naming
  // addr:port.
  uint16_t host_store(const StoreServerOptions& options);
  // Connects both connections to host:port. Throws RendezvousStoreError naming the endpoint when the store
  // cannot be reached, or does not answer, within t.connect.
  void connect(const std::string& host, uint16_t port, const Timeouts& t);
  // Uses a store that is not ddprun's (etcd: DynamicRendezvousOptions::external_store) through the two
  // connections given; `endpoint` names it in messages.
  void attach(std::unique_ptr<Store> store, std::unique_ptr<Store> watcher, std::string endpoint,
              const Timeouts& t);
  // This node's place in the round that next_rendezvous completed.
  void enter_round(int round, int rank, int nodes);

  // One step of the watcher, ending at `deadline` at the latest: by default one WAIT for the round's stop.
  // Throws StoreError; do_wait_round_stopped retries TimeoutError and ConnectionLostError within the stall
  // tolerance.
  virtual std::optional<RoundStop> watch_step(Clock::time_point deadline);
  // For watch_step: the watcher's connection got an answer. True when the store had been silent before (what
  // the watcher timed meanwhile, such as a neighbour's heartbeats, measured the store's silence).
  bool watcher_answered() { return silence_.answered(); }
  // For the watcher: a request failed (no answer, or the connection broke and could not be made again). True
  // when the store is known to be gone for good (no need to ride out the stall tolerance); by default never.
  virtual bool store_gone() { return false; }

  // WAITs for `key` up to `slice` (at most until `deadline`): nullopt once it exists, else the value of the
  // counter `count` (ADD 0), for the progress log. Throws StoreError (ConnectionLostError: the store went
  // away).
  std::optional<int64_t> wait_or_count(const std::string& key, const std::string& count,
                                       Clock::time_point deadline, std::chrono::milliseconds slice);
  RendezvousClosedError closed_error() const;
  // The error for rendezvous data in the store that cannot be read: `what`, quoted `text`, the store.
  RendezvousStoreError unreadable(const std::string& what, const std::string& text) const;
  // `text` read from the store as an int of at least `min`; RendezvousStoreError naming `what` and the store
  // when it is not one.
  int read_int(const std::string& text, const std::string& what, int min = INT_MIN) const;

  RoundStop do_stop_round(const RoundStop& stop) override;
  std::optional<RoundStop> do_wait_round_stopped(std::chrono::milliseconds timeout) override;
  void do_node_done() override;
  void do_set_closed() override;
  bool do_is_closed() override;
  void do_shutdown() override;
  // The agent's identity in status keys ("<host>:<pid>" unless the backend names its agents otherwise).
  // Thread-safe (immutable).
  virtual std::string identity() const;
  RendezvousStoreError store_failure(const StoreError& e) const override;

  RoundKeys keys_;
  std::shared_ptr<const StoreAuth> auth_;      // the job's secret; null: none
  std::unique_ptr<StoreServerThread> server_;  // null unless this node hosts the store
  std::unique_ptr<Store> store_;               // the agent loop's connection
  std::unique_ptr<Store> watcher_;             // the watcher thread's connection
  std::atomic<int> round_{-1};                 // the round this node is in; -1 before the first
  int rank_ = -1;                              // this node's rank in round_
  int nodes_ = 0;                              // nodes in round_

 private:
  std::string endpoint_;              // set by connect()
  mutable std::mutex access_mu_;      // observer_store() runs on other threads
  std::string access_host_;           // guarded by access_mu_: the store's host as connect() reached it
  uint16_t port_ = 0;                 // written under access_mu_
  StoreSilence silence_{"", "", {}};  // watcher thread only; set by connect()
};

}  // namespace ddprun::rdzv
