// What the c10d rendezvous itests share (dynamic_rendezvous_itest.cc, dynamic_recovery_itest.cc): a store on
// 127.0.0.1, participants' options with sub-second timeouts, joining in a known order, and a participant that
// vanishes mid-protocol. Header-only; tests/rendezvous/ only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous/c10d/c10d_round.h"
#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous_participants.h"

namespace ddprun::rdzv::c10d_testing {

using namespace std::chrono_literals;
using namespace ddprun::rdzv::testing;

inline StoreServerOptions loopback_server() {
  StoreServerOptions o;
  o.host = "127.0.0.1";
  return o;
}

// Options of one participant: sub-second protocol timeouts, heartbeats too slow to declare anyone dead within
// kLimit (the heartbeat tests lower them), and a client of the store at `port` unless a test makes it host.
inline DynamicRendezvousOptions c10d(uint16_t port, const std::string& identity, int min, int max) {
  DynamicRendezvousOptions o;
  o.run_id = kRunId;
  o.min_nodes = min;
  o.max_nodes = max;
  o.endpoint_host = "127.0.0.1";
  o.endpoint_port = port;
  o.is_host = false;
  o.identity = identity;
  o.host = "one-host";  // every participant on one host, as agents of one Slurm task per GPU
  o.join_timeout = kLimit;
  o.last_call_timeout = 200ms;
  o.close_timeout = 300ms;
  o.keep_alive_interval = 1s;
  o.keep_alive_max_attempt = 60;
  o.read_timeout = kLimit;
  o.progress_interval = 50ms;
  o.cooldown_base = 300ms;
  o.cooldown_max = 1s;
  return o;
}

using Node = testing::Participant<DynamicRendezvous>;

// The set-up of most tests: a store on a free port of 127.0.0.1, a client that observes it, and the options
// of participants that join it.
struct C10dStore {
  StoreServerThread server{loopback_server()};
  StoreClient obs{"127.0.0.1", server.port(), observer_options()};

  DynamicRendezvousOptions options(const std::string& identity, int min, int max) const {
    return c10d(server.port(), identity, min, max);
  }
};

// Joins `node` and waits until its arrival shows in round r's counter: arrival indexes follow call order.
inline void join_in_order(Node& node, int lws, StoreClient& obs, int round) {
  int64_t before = obs.add(rkey(round, "joined"), 0);
  node.join(lws);
  REQUIRE(eventually([&] { return obs.add(rkey(round, "joined"), 0) > before; }));
}

// Two nodes of a job with MIN = MAX = 2 (node-a, node-b) form round 0, in that order; their round.
struct Pair {
  Node a, b;
  RendezvousInfo ia, ib;
};
inline std::unique_ptr<Pair> form_pair(const C10dStore& s, StoreClient& obs) {
  auto p = std::unique_ptr<Pair>(
      new Pair{Node(s.options("node-a", 2, 2)), Node(s.options("node-b", 2, 2)), {}, {}});
  join_in_order(p->a, 1, obs, 0);
  join_in_order(p->b, 1, obs, 0);
  p->ia = p->a.info();
  p->ib = p->b.info();
  return p;
}

// A participant that vanishes: it joins round r as the next arrival, writes its descriptor, and stops.
inline int64_t ghost_join(StoreClient& c, int round, const std::string& identity) {
  int64_t index = c.add(rkey(round, "joined"), 1) - 1;
  c.set(rkey(round, "node/" + std::to_string(index)),
        encode(
            NodeDescriptor{.identity = identity, .previous_rank = -1, .local_world_size = 1}));  // no standby
  return index;
}

}  // namespace ddprun::rdzv::c10d_testing
