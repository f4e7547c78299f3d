// LossReporter: on the node that hosts the job's store, ends the running round the moment one of its agents
// dies. The store removes a killed agent's connection-bound live/<identity> key as its connection closes and
// tells the hook (StoreServerOptions::on_connection_key_released, on the store's thread); the reporter's own
// thread then, over a connection of its own, publishes the round's stop as a membership change (RoundKeys::
// stop: a round already stopped stays as it is). The survivors' watchers see that stop at once, as for a
// crash, instead of learning the loss only when one of their workers fails on the dead peer (gloo, NCCL) and
// exits — which takes a torch 2.x worker a second or more.
//
// Only the members of the job's current round count — the round the store itself names (key "round", set by
// each round's closer), not the one this node last ran: the store's host may sit out a round (unhealthy,
// cooled down) while the job goes on. A spare or an agent of an older round that dies changes nothing. A node
// that stands aside deletes its own key (step_aside): not a release, no stop. Every store an agent serves
// the job from has one: the store it hosts, and its standby (store_failover.h), which may become the job's
// store after a failover.
//
// Threads: hook() may be called from any thread and never blocks; everything else on the owner's thread. The
// destructor closes the queue and joins. A store error on the reporter's connection is logged (debug) and
// dropped: the survivors' own detection still works.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "rendezvous/round_keys.h"
#include "rendezvous/store/store_auth.h"

namespace ddprun::rdzv {

class LossReporter {
 public:
  // `auth`: the job's secret for its connection to the store (null: none).
  explicit LossReporter(RoundKeys keys, std::shared_ptr<const StoreAuth> auth = nullptr);
  ~LossReporter();
  LossReporter(const LossReporter&) = delete;
  LossReporter& operator=(const LossReporter&) = delete;

  // The store's release hook.
  std::function<void(const std::string& key)> hook() const;
  // Starts the thread, which reaches the store at host:port.
  void start(const std::string& host, uint16_t port);

 private:
  struct Queue;
  void run(const std::string& host, uint16_t port);

  RoundKeys keys_;
  std::shared_ptr<const StoreAuth> auth_;
  std::shared_ptr<Queue> queue_;
  std::thread thread_;
};

}  // namespace ddprun::rdzv
