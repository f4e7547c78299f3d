// RoundWatcher: the agent's store watcher, a thread blocked in RendezvousHandler::wait_round_stopped while a
// round runs. It reports once, through the loop's EventQueue, that the round was stopped (by any node) or
// that the store was lost, tagged with the round it watched (the loop drops reports about an earlier round).
//
// Threads: start() and stop() on the loop's thread; the watcher itself calls only wait_round_stopped (which
// the handler allows beside the loop's calls) and EventQueue::push. stop() waits up to one second for the
// thread (its wait's timeout). Internal to the agent loop.
#pragma once

#include <atomic>
#include <thread>

#include "agent/loop/event_queue.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

class RoundWatcher {
 public:
  RoundWatcher(rdzv::RendezvousHandler& rendezvous, EventQueue& events)
      : rdzv_(rendezvous), events_(events) {}
  ~RoundWatcher() { stop(); }
  RoundWatcher(const RoundWatcher&) = delete;
  RoundWatcher& operator=(const RoundWatcher&) = delete;

  // Watches `round` until it stops, the store is lost, or stop(). Precondition: not watching.
  void start(int round);
  // Ends the watch and joins the thread (nothing when not watching).
  void stop();

 private:
  rdzv::RendezvousHandler& rdzv_;
  EventQueue& events_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace ddprun::agent
