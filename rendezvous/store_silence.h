// StoreSilence: how long the store has not answered the calls of a rendezvous handler's watcher thread
// (heartbeats, waits for the end of a round), so that a stall shorter than the tolerance is ridden out and a
// longer one is reported as what it is: "the store at H:P did not answer for 26 s", or, when the connection
// broke and could not be made again, "the store at H:P went away and could not be reached for 26 s".
//
// Silence is counted from the start of the first call that failed since the store last answered (a call that
// was already under way when the store stalled counts from its start). Monotonic clock only. Not thread-safe:
// one per calling thread (the agent's watcher).
#pragma once

#include <chrono>
#include <string>
#include <utility>

#include "rendezvous/rendezvous_error.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/util/duration_text.h"

namespace ddprun::rdzv {

class StoreSilence {
 public:
  using Clock = std::chrono::steady_clock;

  // `context` starts every message (e.g. "rendezvous 'job': ").
  StoreSilence(std::string context, std::string endpoint, std::chrono::milliseconds tolerance)
      : context_(std::move(context)), endpoint_(std::move(endpoint)), tolerance_(tolerance) {}

  // A call got its answer. Returns true when calls had failed since the last answer (the caller then forgets
  // what it timed meanwhile, e.g. a neighbour's silence that was the store's).
  bool answered() {
    lost_ = false;
    return std::exchange(failing_, false);
  }

  // A call that started at `started` failed with `e` (a TimeoutError or a ConnectionLostError: errors worth
  // retrying). Returns when the store has been silent for at most the tolerance, and the caller retries;
  // throws RendezvousStoreError after that.
  void failed(const StoreError& e, Clock::time_point started) {
    if (!std::exchange(failing_, true)) silent_since_ = started;
    lost_ = lost_ || dynamic_cast<const ConnectionLostError*>(&e) != nullptr;
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - silent_since_);
    if (silent <= tolerance_) return;
    // A handshake that got no reply is a stall like any other, whatever the client guesses about dialects.
    const std::string last =
        dynamic_cast<const HandshakeTimeoutError*>(&e) ? "no reply to the connection's handshake" : e.what();
    throw RendezvousStoreError(context_ + "the store at " + endpoint_ +
                               (lost_ ? " went away and could not be reached for " : " did not answer for ") +
                               duration_text(silent) + " (tolerated: " + duration_text(tolerance_) +
                               "); last error: " + last);
  }

  // Whether `e` says the store is silent or unreachable (a TimeoutError or a ConnectionLostError): the errors
  // that a stall or a lost store host gives, worth riding out or failing over, unlike a reply that makes no
  // sense.
  static bool silent_or_gone(const StoreError& e) {
    return dynamic_cast<const TimeoutError*>(&e) != nullptr ||
           dynamic_cast<const ConnectionLostError*>(&e) != nullptr;
  }

 private:
  std::string context_;
  std::string endpoint_;
  std::chrono::milliseconds tolerance_;
  Clock::time_point silent_since_{};
  bool failing_ = false;
  bool lost_ = false;  // a ConnectionLostError since the last answer
};

}  // namespace ddprun::rdzv
