// Integration tests: a store that stalls, or goes away, while a round runs (no root). The store runs on an
// io_context of the test's own, which the test freezes by parking a handler on it — to clients exactly like a
// SIGSTOPped store: connections are accepted by the kernel, nothing is answered. Participants watch their
// round as the agent's watcher thread does (wait_round_stopped in a loop). Timeouts are fractions of a
// second; the stall lengths are the stimulus, every wait for an outcome is bounded by kLimit.
#include <boost/asio.hpp>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20
#include <vector>

#include "catch_compat.h"
#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/c10d/store_failover.h"
#include "rendezvous/static_rendezvous.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous_participants.h"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;
using namespace testing;
using std::chrono::milliseconds;

// A store on 127.0.0.1 whose io thread the test can park (freeze), release (thaw), or stop for good (kill).
class FreezableStore {
 public:
  FreezableStore()
      : server_(io_, StoreServerOptions{.host = "127.0.0.1"}),
        port_(server_.port()),
        thread_([this] { io_.run(); }) {}
  ~FreezableStore() {
    kill();
    work_.reset();
    thread_.join();
  }
  uint16_t port() const { return port_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  void freeze() {
    release_ = std::promise<void>();
    boost::asio::post(io_, [f = release_.get_future().share()] { f.wait(); });
    frozen_ = true;
  }
  void thaw() {
    if (frozen_) release_.set_value();
    frozen_ = false;
  }
  // As if the store's process died: the listening socket and every connection close. Idempotent.
  void kill() {
    thaw();
    std::promise<void> stopped;
    boost::asio::post(io_, [&] {
      server_.stop();
      stopped.set_value();
    });
    stopped.get_future().wait();
  }

 private:
  boost::asio::io_context io_;
  // Keeps io_.run() going once the server stopped, until the destructor.
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ =
      boost::asio::make_work_guard(io_);
  StoreServer server_;
  uint16_t port_;
  std::thread thread_;
  std::promise<void> release_;
  bool frozen_ = false;
};

// Heartbeats every 200 ms, a node silent for 3 x 200 ms = 0.6 s is dead; the store may be silent for
// read_timeout = 1.5 s (no failover).
DynamicRendezvousOptions watched(uint16_t port, const std::string& identity) {
  DynamicRendezvousOptions o;
  o.run_id = kRunId;
  o.min_nodes = o.max_nodes = 2;
  o.endpoint_host = "127.0.0.1";
  o.endpoint_port = port;
  o.is_host = false;
  o.identity = o.host = identity;
  o.join_timeout = kLimit;
  o.keep_alive_interval = 200ms;
  o.keep_alive_max_attempt = 3;
  o.read_timeout = 1500ms;
  o.progress_interval = 50ms;
  o.failover =
      false;  // the stall tolerance of a store nobody replaces (store_failover_itest.cc: with failover)
  return o;
}

// Runs `node`'s watcher loop (as the agent's) until `until`: "" when the round did not stop and nothing was
// thrown, else "stopped: <detail>" or "store error: <message>".
std::string watch(RendezvousHandler& node, Clock::time_point until) {
  try {
    while (Clock::now() < until) {
      if (auto stop = node.wait_round_stopped(200ms)) return "stopped: " + stop->detail;
    }
    return "";
  } catch (const RendezvousStoreError& e) {
    return std::string("store error: ") + e.what();
  }
}

// Two c10d nodes in round 0 at `store`, and an observer of the store.
struct Round {
  explicit Round(FreezableStore& store)
      : a(watched(store.port(), "node-a")),
        b(watched(store.port(), "node-b")),
        obs("127.0.0.1", store.port(), observer_options()) {
    a.join(1);
    b.join(1);
    a.info();
    b.info();
  }
  // Runs both watchers until `until`.
  void watch_until(Clock::time_point until) {
    wa = std::async(std::launch::async, [this, until] { return watch(*a.rdzv, until); });
    wb = std::async(std::launch::async, [this, until] { return watch(*b.rdzv, until); });
  }
  // True once both nodes' heartbeat counters moved past `beats`.
  bool beating(int64_t beats) {
    return eventually(
        [&] { return obs.add(rkey(0, "hb/0"), 0) > beats && obs.add(rkey(0, "hb/1"), 0) > beats; });
  }

  Participant<DynamicRendezvous> a, b;
  StoreClient obs;
  std::future<std::string> wa, wb;
};

}  // namespace

TEST_CASE("StoreClient: a stalled store is a TimeoutError at the handshake and at a WAIT's cancel",
          "[store][stall][integration]") {
  FreezableStore store;
  StoreClientOptions o;
  o.connect_timeout = 1s;
  o.timeout = 300ms;
  StoreClient client("127.0.0.1", store.port(), o);
  store.freeze();
  // The cancel of a WAIT that timed out gets no reply either: a stalled store, not keys that are missing.
  auto start = Clock::now();
  try {
    client.wait({"never"}, 100ms);
    FAIL("WAIT returned from a frozen store");
  } catch (const WaitTimeoutError& e) {
    FAIL("a stalled store was taken for missing keys: " << e.what());
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("CANCEL_WAIT"));
  }
  CHECK(Clock::now() - start < kLimit / 2);
  // A new connection's handshake: a timeout, said as one (not a reply that makes no sense).
  try {
    StoreClient late("127.0.0.1", store.port(), o);
    FAIL("connected to a frozen store");
  } catch (const HandshakeTimeoutError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("handshake: no reply from the store at " + store.endpoint()));
  }
  store.thaw();
}

TEST_CASE(
    "c10d rendezvous: a store stall longer than the heartbeat timeout but within read_timeout is ridden out",
    "[c10d][stall][integration]") {
  FreezableStore store;
  Round round(store);
  round.watch_until(Clock::now() + kLimit / 4);
  REQUIRE(round.beating(1));
  const int64_t before = round.obs.add(rkey(0, "hb/0"), 0);
  store.freeze();
  std::this_thread::sleep_for(1s);  // the stall: over 0.6 s of heartbeat silence, under read_timeout (1.5 s)
  store.thaw();
  CHECK(round.beating(before + 2));  // heartbeats resume on both nodes
  CHECK(round.wa.get() == "");       // nobody was declared dead, nothing was thrown
  CHECK(round.wb.get() == "");
  CHECK_FALSE(round.obs.check({rkey(0, "stop")}));
}

TEST_CASE(
    "c10d rendezvous: a store silent or gone for longer than read_timeout is reported as what it is, naming "
    "it",
    "[c10d][stall][integration]") {
  // A frozen store: a timeout ("did not answer"), never a dialect problem. A killed one: lost.
  const bool killed = GENERATE(false, true);
  const std::string how = killed ? " went away and could not be reached for " : " did not answer for ";
  CAPTURE(killed);
  FreezableStore store;
  Round round(store);
  round.watch_until(Clock::now() + kLimit);
  REQUIRE(round.beating(1));
  killed ? store.kill() : store.freeze();
  const auto start = Clock::now();
  REQUIRE(round.wa.wait_for(kLimit) == std::future_status::ready);
  CHECK(Clock::now() - start >= 1500ms);
  const std::string what = round.wa.get();
  INFO(what);
  CHECK_THAT(what,
             Catch::StartsWith("store error: rendezvous 'job': the store at " + store.endpoint() + how));
  CHECK_THAT(what, Catch::Contains("(tolerated: 1.5 s)"));
  CHECK_THAT(what, !Catch::Contains("dialect"));
  CHECK_THAT(round.wb.get(), Catch::Contains(how));
  store.thaw();
}

TEST_CASE("static rendezvous: a store stall within connect_timeout is ridden out, a longer one is reported",
          "[static][stall][integration]") {
  FreezableStore store;
  StaticRendezvousOptions o;
  o.run_id = kRunId;
  o.nnodes = 1;
  o.master_addr = "127.0.0.1";
  o.master_port = store.port();
  o.join_timeout = kLimit;
  o.connect_timeout = 1500ms;
  StaticRendezvous node(o);
  node.next_rendezvous(1);

  auto short_stall = std::async(std::launch::async, [&] { return watch(node, Clock::now() + 2500ms); });
  store.freeze();
  std::this_thread::sleep_for(800ms);  // the stall, under connect_timeout
  store.thaw();
  CHECK(short_stall.get() == "");

  store.freeze();
  const std::string what = watch(node, Clock::now() + kLimit);
  store.thaw();
  INFO(what);
  CHECK_THAT(what, Catch::StartsWith("store error: rendezvous 'job': the store at " + store.endpoint() +
                                     " did not answer for "));
  CHECK_THAT(what, Catch::Contains("(tolerated: 1.5 s)"));
  // A fixed node count cannot outlive its store host: the message says what can.
  CHECK_THAT(what, Catch::Contains("cannot change its world size"));
  CHECK_THAT(what, Catch::EndsWith("run every node with --rdzv_backend c10d --nnodes MIN:MAX"));
}

// With failover (the default for c10d): heartbeat timeout 5 x 200 ms = 1 s; every node keeps a standby
// store. The last call is as long as the test's limit, so a round after a failover that completes in time
// closed because every expected survivor joined.
DynamicRendezvousOptions failing_over(uint16_t port, const std::string& identity) {
  DynamicRendezvousOptions o = watched(port, identity);
  o.failover = true;
  o.keep_alive_max_attempt = 5;
  o.min_nodes = 2;
  o.max_nodes = 3;
  o.last_call_timeout = kLimit;
  o.close_timeout = 5s;
  return o;
}

// Three c10d nodes in round 0 at `store` (it is not one of them: each can take over).
struct Trio {
  explicit Trio(FreezableStore& store) {
    for (const char* id : {"node-a", "node-b", "node-c"}) nodes.emplace_back(failing_over(store.port(), id));
    for (auto& n : nodes) n.join(1);
    for (auto& n : nodes) REQUIRE(n.info().group_world_size == 3);
  }
  // Runs the watchers of the nodes still there until each returns.
  std::vector<std::string> watch_all(Clock::time_point until) {
    std::vector<std::future<std::string>> w;
    for (auto& n : nodes) {
      if (n.rdzv) w.push_back(std::async(std::launch::async, [&n, until] { return watch(*n.rdzv, until); }));
    }
    std::vector<std::string> out;
    for (auto& f : w) out.push_back(f.get());
    return out;
  }
  // The nodes still there join the next round; returns their rounds.
  std::vector<RendezvousInfo> rejoin() {
    std::vector<RendezvousInfo> infos;
    for (auto& n : nodes) {
      if (n.rdzv) n.join(1);
    }
    for (auto& n : nodes) {
      if (!n.rdzv) continue;
      REQUIRE(n.ready(kLimit / 2));
      infos.push_back(n.round.get());
    }
    return infos;
  }
  std::vector<Participant<DynamicRendezvous>> nodes;
};

TEST_CASE("c10d failover: the survivors of a store that went away form the next round at the first successor",
          "[c10d][failover][integration]") {
  // A successor that is gone as well (its agent died with the store) is passed over.
  const bool first_successor_gone = GENERATE(false, true);
  CAPTURE(first_successor_gone);
  FreezableStore store;
  Trio trio(store);
  if (first_successor_gone) trio.nodes[0].rdzv.reset();  // node-a: rank 0, the first successor
  store.kill();
  for (const std::string& what : trio.watch_all(Clock::now() + kLimit)) {
    CHECK(what == "stopped: the store at " + store.endpoint() + " is lost");
  }
  const auto infos = trio.rejoin();
  const int survivors = first_successor_gone ? 2 : 3;
  REQUIRE(infos.size() == static_cast<size_t>(survivors));
  for (const auto& info : infos) {
    CHECK(info.round == 1);
    CHECK(info.group_world_size == survivors);  // nobody waited for the (kLimit) last call
    CHECK(info.store_host == "127.0.0.1");
    CHECK(info.store_port == infos[0].store_port);
    CHECK(info.store_port != store.port());
  }
  // The new store is the first live successor's: rank 0 of the round, which now hosts the store.
  auto& host = trio.nodes[first_successor_gone ? 1 : 0];
  CHECK(host.rdzv->hosts_store());
  CHECK(host.rdzv->store_port() == infos[0].store_port);
}

TEST_CASE("c10d failover: the store that took over ends the round the moment a member's agent dies",
          "[c10d][failover][integration]") {
  FreezableStore store;
  Trio trio(store);
  store.kill();
  trio.watch_all(Clock::now() + kLimit);
  const auto infos = trio.rejoin();
  REQUIRE(infos.size() == 3);
  REQUIRE(infos[0].round == 1);
  REQUIRE(trio.nodes[0].rdzv->hosts_store());  // node-a's standby is the job's store now
  StoreClient obs("127.0.0.1", infos[0].store_port, observer_options());
  // Nobody watches (no heartbeats are sent or checked): only the new store's loss reporter can see node-c go.
  trio.nodes[2].rdzv.reset();
  REQUIRE(eventually([&] { return obs.check({rkey(1, "stop")}); }));
  const auto stop = decode_round_stop(obs.get(rkey(1, "stop")));
  REQUIRE(stop);
  CHECK(stop->kind == RoundStop::Kind::kMembership);
  CHECK_THAT(stop->detail, Catch::Contains("node 2 lost: its agent's connection to the store closed"));
}

TEST_CASE("c10d failover: a store silent for less than the heartbeat timeout keeps the job, longer moves it",
          "[c10d][failover][integration]") {
  FreezableStore store;
  Trio trio(store);
  store.freeze();
  std::this_thread::sleep_for(300ms);  // under a third of the heartbeat timeout
  store.thaw();
  for (const std::string& what : trio.watch_all(Clock::now() + 1500ms)) CHECK(what == "");

  store.freeze();  // and it stays frozen: its host's kernel still accepts, nothing answers
  const auto start = Clock::now();
  for (const std::string& what : trio.watch_all(Clock::now() + kLimit)) {
    CHECK(what == "stopped: the store at " + store.endpoint() + " is lost");
  }
  CHECK(Clock::now() - start >= 1000ms);  // never before the heartbeat timeout
  const auto infos = trio.rejoin();
  REQUIRE(infos.size() == 3);
  for (const auto& info : infos) CHECK((info.round == 1 && info.store_port == infos[0].store_port));
  CHECK(trio.nodes[0].rdzv->hosts_store());
  store.thaw();
}

TEST_CASE("c10d failover: a node whose workers succeeded takes a lost store as the end of its round",
          "[c10d][failover][integration]") {
  FreezableStore store;
  Trio trio(store);
  trio.nodes[2].rdzv->node_done();  // node-c waits in its exit barrier
  store.kill();
  const auto what = trio.watch_all(Clock::now() + kLimit);
  REQUIRE(what.size() == 3);
  CHECK(what[0] == "stopped: the store at " + store.endpoint() + " is lost");
  CHECK(what[2] ==
        "stopped: the store at " + store.endpoint() + " is lost after this node's workers succeeded");
}

TEST_CASE("store failover: successors round-trip through the store's text; anything else is refused",
          "[failover]") {
  StoreFailover::Successors s{.without_standby = 1,
                              .endpoints = {Endpoint{"10.0.0.2", 29400}, Endpoint{"::1", 7}}};
  const std::string text = StoreFailover::encode(s);
  CHECK(text == "1|10.0.0.2:29400,[::1]:7");
  auto back = StoreFailover::decode(text);
  REQUIRE(back);
  CHECK(back->without_standby == 1);
  CHECK(back->endpoints == s.endpoints);
  CHECK(StoreFailover::decode("0|")->endpoints.empty());
  for (const char* bad : {"", "1", "x|a:1", "-1|a:1", "1|a:1,,b:2", "1|a"}) {
    CAPTURE(bad);
    CHECK_FALSE(StoreFailover::decode(bad));
  }
}

}  // namespace ddprun::rdzv
