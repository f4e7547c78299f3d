// Test support for the rendezvous tests that run without root: rendezvous participants as threads against
// one store on 127.0.0.1, and the bounded waits they share (eventually(): tests/eventually.h). Header-only;
// for tests/rendezvous/*_itest.cc.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "catch_compat.h"
#include "eventually.h"
#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/store/store_client.h"

namespace ddprun::rdzv::testing {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline constexpr auto kLimit = 20s;  // bound of every wait; never reached when things work
inline const std::string kRunId = "job";

// A plain client for reading the store's state.
inline StoreClientOptions observer_options() {
  StoreClientOptions o;
  o.connect_timeout = 5s;
  o.timeout = 5s;
  return o;
}

// A key of round `round` of kRunId, as the agents name it (the client adds the leading "/").
inline std::string rkey(int round, const std::string& k) {
  return "ddprun/" + kRunId + "/r" + std::to_string(round) + "/" + k;
}

using ddprun::testing::eventually;  // bounded by kLimit (its default limit)

// One agent: its rendezvous and the join it runs on a thread of its own. The future is declared after the
// rendezvous, so a failing test first waits for the join to end (bounded by join_timeout), then destroys it.
template <typename Rendezvous>
struct Participant {
  std::unique_ptr<Rendezvous> rdzv;
  std::future<RendezvousInfo> round;

  template <typename Options>
  explicit Participant(Options o) : rdzv(std::make_unique<Rendezvous>(std::move(o))) {}
  void join(int local_world_size) {
    round = std::async(std::launch::async,
                       [r = rdzv.get(), local_world_size] { return r->next_rendezvous(local_world_size); });
  }
  bool ready(std::chrono::milliseconds limit = kLimit) const {
    return round.wait_for(limit) == std::future_status::ready;
  }
  RendezvousInfo info() {
    REQUIRE(ready());
    return round.get();
  }
};

}  // namespace ddprun::rdzv::testing
