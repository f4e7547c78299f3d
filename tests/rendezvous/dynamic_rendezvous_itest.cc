// Integration tests of DynamicRendezvous (the c10d backend): N participants as threads of this process
// against one store on 127.0.0.1 (a StoreServerThread on port 0, or a participant that hosts it on port 0),
// no root and no network namespaces. Participants that must vanish mid-protocol are played by a raw
// StoreClient that does their first steps and stops. Timeouts are fractions of a second; the test waits for
// conditions (store keys, futures) with deadlines, never with fixed sleeps, and every wait is bounded by
// kLimit.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "c10d_fixture.h"
#include "catch_compat.h"
#include "rendezvous/c10d/c10d_round.h"
#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous_participants.h"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;
using namespace testing;
using namespace c10d_testing;

// A TCP proxy on 127.0.0.1 in front of a store: forwards bytes both ways, one thread per connection. Once
// cut_after_next_answer() is called, the next bytes the store sends on any connection are forwarded and then
// that connection is closed on both sides and the proxy accepts no more: a store that answered a WAIT and was
// gone before the next request could reach it.
class CuttingProxy {
 public:
  explicit CuttingProxy(uint16_t target) : target_(target) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listen_fd_, 16) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~CuttingProxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    for (auto& t : pumps_) t.join();
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }
  void cut_after_next_answer() { armed_ = true; }
  bool cut() const { return cut_; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0 || cut_) continue;
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(target_);
      if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      pumps_.emplace_back([this, client, server] { pump(client, server); });
    }
  }
  void pump(int client, int server) {
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      if (p[0].revents) {
        const ssize_t n = ::read(client, buf, sizeof buf);
        if (n <= 0 || ::write(server, buf, static_cast<size_t>(n)) != n) break;
      }
      if (p[1].revents) {
        const ssize_t n = ::read(server, buf, sizeof buf);
        if (n <= 0 || ::write(client, buf, static_cast<size_t>(n)) != n) break;
        if (armed_.exchange(false)) {
          cut_ = true;
          break;
        }
      }
    }
    ::close(client);
    ::close(server);
  }

  uint16_t target_, port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> armed_{false}, cut_{false}, stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;  // the acceptor's only
};

}  // namespace

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: nodes meet in one round, the closer assigns ranks, base ranks and the worker keyspace",
    "[c10d][integration]") {
  // All newcomers: ranks follow the identities, not the arrival order. Local world sizes differ per node.
  Node c(options("node-c", 3, 3));
  Node a(options("node-a", 3, 3));
  Node b(options("node-b", 3, 3));
  join_in_order(c, 1, obs, 0);
  join_in_order(a, 2, obs, 0);
  join_in_order(b, 3, obs, 0);  // arrival number MIN = MAX: closes at once (no last call)

  RendezvousInfo ia = a.info(), ib = b.info(), ic = c.info();
  for (const auto* i : {&ia, &ib, &ic}) {
    CHECK(i->round == 0);
    CHECK(i->group_world_size == 3);
    CHECK(i->world_size == 6);
    CHECK(i->store_host == "127.0.0.1");
    CHECK(i->store_port == server.port());
  }
  CHECK(ia.group_rank == 0);
  CHECK(ia.base_rank == 0);
  CHECK(ib.group_rank == 1);
  CHECK(ib.base_rank == 2);
  CHECK(ic.group_rank == 2);
  CHECK(ic.base_rank == 5);

  CHECK(obs.get(rkey(0, "closed")) == "3");
  CHECK(obs.get("ddprun/" + kRunId + "/round") == "0");
  // The round's workers get a keyspace of their own, opened before the round was published.
  CHECK(obs.get("ddprun/worker_keyspace") == kRunId + "/r0");
  CHECK(obs.get(rkey(0, "members")) == "node-a|node-b|node-c");  // in rank order, for the next closer
  CHECK(obs.get(rkey(0, "dropped")).empty());
}

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: the last call closes the round with the nodes present once last_call_timeout passes",
    "[c10d][integration]") {
  Node a(options("node-a", 2, 4));
  Node b(options("node-b", 2, 4));
  auto start = Clock::now();
  join_in_order(a, 1, obs, 0);
  join_in_order(b, 1, obs, 0);  // arrival number MIN: runs the last call
  RendezvousInfo ia = a.info(), ib = b.info();
  auto took = Clock::now() - start;
  CHECK(ia.group_world_size == 2);
  CHECK(ib.group_world_size == 2);
  CHECK(std::set<int>{ia.group_rank, ib.group_rank} == std::set<int>{0, 1});
  CHECK(took >= 200ms);  // the round stayed open for more nodes (last_call_timeout)
  CHECK_FALSE(obs.check({rkey(0, "full")}));
  CHECK(obs.get(rkey(0, "closed")) == "2");
}

TEST_CASE_METHOD(C10dStore,
                 "c10d rendezvous: the arrival that makes the round full ends the last call at once",
                 "[c10d][integration]") {
  std::vector<std::unique_ptr<Node>> nodes;
  for (const char* id : {"node-a", "node-b", "node-c"}) {
    auto o = options(id, 2, 3);
    o.last_call_timeout = 2 * kLimit;  // a last call that ran out would fail the wait below
    nodes.push_back(std::make_unique<Node>(o));
  }
  for (auto& n : nodes) join_in_order(*n, 1, obs, 0);
  std::set<int> ranks;
  for (auto& n : nodes) {
    RendezvousInfo i = n->info();
    CHECK(i.group_world_size == 3);
    ranks.insert(i.group_rank);
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
  CHECK(obs.get(rkey(0, "closed")) == "3");
}

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: a late node with room ends the round, everyone re-forms a bigger one in a fresh "
    "keyspace",
    "[c10d][integration]") {
  Node a(options("node-z", 2, 3));
  Node b(options("node-y", 2, 3));
  join_in_order(a, 2, obs, 0);
  join_in_order(b, 2, obs, 0);
  RendezvousInfo a0 = a.info(), b0 = b.info();
  REQUIRE(b0.group_rank == 0);  // newcomers by identity: node-y before node-z
  REQUIRE(a0.group_rank == 1);
  REQUIRE(a0.world_size == 4);
  REQUIRE(obs.get("ddprun/worker_keyspace") == kRunId + "/r0");
  // A worker of round 0 writes a key into its keyspace (the store binds its connection to it).
  StoreClient worker0("127.0.0.1", server.port(), observer_options());
  worker0.set("MASTER_ADDR_KEY", "round-0");

  // The late node sorts first by identity, but newcomers follow the previous round's members.
  Node c(options("node-a", 2, 3));
  c.join(2);
  auto sa = a.rdzv->wait_round_stopped(kLimit);
  auto sb = b.rdzv->wait_round_stopped(kLimit);
  REQUIRE(sa);
  REQUIRE(sb);
  CHECK(sa->kind == RoundStop::Kind::kMembership);
  CHECK_THAT(sa->detail, Catch::Contains("node-a arrived"));
  CHECK(sb->detail == sa->detail);

  a.join(2);
  b.join(2);
  RendezvousInfo a1 = a.info(), b1 = b.info(), c1 = c.info();
  for (const auto* i : {&a1, &b1, &c1}) {
    CHECK(i->round == 1);
    CHECK(i->group_world_size == 3);
    CHECK(i->world_size == 6);
  }
  CHECK(b1.group_rank == 0);  // members of the previous round keep their order
  CHECK(a1.group_rank == 1);
  CHECK(c1.group_rank == 2);  // the newcomer follows
  CHECK(c1.base_rank == 4);

  CHECK(obs.get("ddprun/worker_keyspace") == kRunId + "/r1");
  StoreClient worker1("127.0.0.1", server.port(), observer_options());
  CHECK_FALSE(worker1.check({"MASTER_ADDR_KEY"}));     // round 1's workers do not see round 0's keys
  CHECK(worker0.get("MASTER_ADDR_KEY") == "round-0");  // a straggler of round 0 keeps its own keyspace
}

TEST_CASE_METHOD(C10dStore,
                 "c10d rendezvous: a node arriving at a full round waits as a spare and joins the next round",
                 "[c10d][integration]") {
  Node a(options("node-a", 2, 2));
  Node b(options("node-b", 2, 2));
  join_in_order(a, 1, obs, 0);
  join_in_order(b, 1, obs, 0);
  REQUIRE(a.info().group_rank == 0);
  REQUIRE(b.info().group_rank == 1);

  Node spare(options("node-0-spare", 2, 2));
  join_in_order(spare, 1, obs, 0);
  CHECK_FALSE(spare.ready(0ms));  // round 0 is full: it waits for it to end

  // A worker of node b fails; node b does not come back, node a and the spare form round 1.
  b.rdzv->stop_round(RoundStop{RoundStop::Kind::kFailed, 1, "rank 1 exited with 3", 3});
  a.join(1);
  RendezvousInfo a1 = a.info(), s1 = spare.info();
  CHECK(a1.round == 1);
  CHECK(s1.round == 1);
  CHECK(a1.group_rank == 0);  // the previous member first, although the spare's identity sorts first
  CHECK(s1.group_rank == 1);
  CHECK(s1.group_world_size == 2);
}

TEST_CASE(
    "c10d rendezvous: a second job reusing a running job's id and endpoint is told so, not left to lose the "
    "store",
    "[c10d][integration]") {
  // The first job hosts the store on this machine (port 0: a free one) and runs its single node.
  auto first_options = c10d(0, "job-1-node", 1, 1);
  first_options.is_host = true;
  Node first(first_options);
  first.join(1);
  RendezvousInfo running = first.info();
  REQUIRE(first.rdzv->hosts_store());
  StoreClient obs("127.0.0.1", running.store_port, observer_options());

  // The second job, same --rdzv_id and endpoint: its agent finds the port taken and joins the store there.
  auto second_options = c10d(running.store_port, "job-2-node", 1, 1);
  second_options.is_host.reset();
  Node second(second_options);
  REQUIRE_FALSE(second.rdzv->hosts_store());
  join_in_order(second, 1, obs, 0);
  CHECK_FALSE(second.ready(0ms));

  // The first job succeeds: the round ends as done, then the agent closes the rendezvous and leaves with its
  // store, as ElasticAgent does. The second agent must not start a round of the finished job meanwhile.
  first.rdzv->node_done();
  REQUIRE(eventually([&] { return second.ready(0ms) || obs.check({rkey(1, "joined")}); }));
  first.rdzv->set_closed();
  first.rdzv->shutdown();
  first.rdzv.reset();

  REQUIRE(second.ready());
  try {
    second.round.get();
    FAIL("the second job joined the first job's store");
  } catch (const RendezvousConflictError& e) {  // not "closed": this agent belongs to another job
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::Contains("'job'"));
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(running.store_port)));
    CHECK_THAT(e.what(), Catch::Contains("reuses the --rdzv_id and endpoint of a running one"));
  }
}

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: a spare whose job ends and whose store closes at once is not needed, not failed",
    "[c10d][integration]") {
  // A spare waits at the full round of a 1-node job, through a proxy. The job succeeds and its agent leaves
  // at once with the store: here, right after the store answered the spare's WAIT for the round's stop,
  // before the spare could read it. The spare must learn the job is over (its agent exits 0), not that the
  // store vanished (exit 4: seen once in test_node_health_netns).
  Node a(options("node-a", 1, 1));
  join_in_order(a, 1, obs, 0);
  REQUIRE(a.info().group_rank == 0);
  CuttingProxy proxy(server.port());
  Node spare(c10d(proxy.port(), "node-spare", 1, 1));
  join_in_order(spare, 1, obs, 0);
  CHECK_FALSE(spare.ready(200ms));  // waits at the full round (its WAIT in flight)
  proxy.cut_after_next_answer();
  a.rdzv->node_done();
  REQUIRE(spare.ready());
  CHECK(proxy.cut());
  try {
    spare.round.get();
    FAIL("the spare joined a finished job");
  } catch (const SpareNotNeededError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::Contains("the job finished (round 0 stopped, then its store closed)"));
  }
}

TEST_CASE("c10d rendezvous: the host giving up at its join timeout is a join timeout on the other nodes",
          "[c10d][integration]") {
  auto host_options = c10d(0, "node-a", 3, 3);
  host_options.is_host = true;
  host_options.join_timeout = 500ms;
  Node host(host_options);
  REQUIRE(host.rdzv->hosts_store());
  const uint16_t port = host.rdzv->store_port();
  REQUIRE(port != 0);
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  StoreClient obs("127.0.0.1", port, observer_options());

  Node other(c10d(port, "node-b", 3, 3));  // join_timeout kLimit: it must not be what ends its wait
  join_in_order(other, 1, obs, 0);
  auto start = Clock::now();
  join_in_order(host, 1, obs, 0);
  // Only 2 of 3 nodes: the host times out first and names who joined and where.
  REQUIRE(host.ready());
  try {
    host.round.get();
    FAIL("the round completed with 2 of 3 nodes");
  } catch (const RendezvousTimeoutError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::Contains("only 2 of at least 3 nodes joined"));
    CHECK_THAT(e.what(), Catch::Contains("(joined: node-b, node-a)"));
    CHECK_THAT(e.what(), Catch::Contains(endpoint));
  }
  // Its agent exits, and the store with it.
  obs.close();
  host.rdzv.reset();

  REQUIRE(other.ready());
  CHECK(Clock::now() - start < kLimit / 2);  // reported when the store left, not at its own deadline
  try {
    other.round.get();
    FAIL("the round completed without its store");
  } catch (const RendezvousTimeoutError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::Contains("rendezvous 'job' round 0"));
    CHECK_THAT(e.what(), Catch::Contains("the store at " + endpoint + " went away"));
    CHECK_THAT(e.what(), Catch::Contains("join timeout"));
  }
}

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: a node that waits longer than the last call closes the round the last-call node left",
    "[c10d][integration]") {
  Node a(options("node-a", 2, 3));
  auto start = Clock::now();
  join_in_order(a, 2, obs, 0);
  StoreClient ghost("127.0.0.1", server.port(), observer_options());
  REQUIRE(ghost_join(ghost, 0, "ghost") == 1);  // arrival number MIN: should run the last call, vanishes
  ghost.close();

  RendezvousInfo ia = a.info();
  CHECK(Clock::now() - start >= 500ms);  // after last_call_timeout + close_timeout
  CHECK(ia.round == 0);
  CHECK(ia.group_world_size == 2);
  CHECK(ia.group_rank == 1);  // "ghost" sorts before "node-a"
  CHECK(ia.base_rank == 1);
  CHECK(ia.world_size == 3);
  CHECK(obs.get(rkey(0, "closed")) == "2");
  CHECK_THAT(obs.get(rkey(0, "assign/1")),
             Catch::StartsWith("0|2|0|3|"));  // the vanished node was assigned too
}

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: a closer that vanished before assigning ranks: the nodes re-form in the next round",
    "[c10d][integration]") {
  Node a(options("node-a", 2, 2));
  join_in_order(a, 1, obs, 0);
  StoreClient ghost("127.0.0.1", server.port(), observer_options());
  REQUIRE(ghost_join(ghost, 0, "ghost") == 1);
  REQUIRE(ghost.compare_set(rkey(0, "closed"), "", "2") == "2");  // wins the close, then vanishes
  ghost.close();

  // Node a gets no assignment within close_timeout, ends round 0 and waits in round 1, where b joins it.
  REQUIRE(eventually([&] { return obs.add(rkey(1, "joined"), 0) == 1; }));
  auto stop = decode_round_stop(obs.get(rkey(0, "stop")));
  REQUIRE(stop);
  CHECK(stop->kind == RoundStop::Kind::kMembership);
  CHECK(stop->detail == "closer vanished");
  Node b(options("node-b", 2, 2));
  join_in_order(b, 1, obs, 1);
  RendezvousInfo ia = a.info(), ib = b.info();
  CHECK(ia.round == 1);
  CHECK(ib.round == 1);
  CHECK(ia.group_rank == 0);
  CHECK(ib.group_rank == 1);
  CHECK(obs.get("ddprun/worker_keyspace") == kRunId + "/r1");
}

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: a node that stops heartbeating is declared dead, the survivor re-forms without it",
    "[c10d][integration]") {
  auto heartbeating = [&](const std::string& id) {
    auto o = options(id, 1, 2);
    o.keep_alive_interval = 200ms;
    o.keep_alive_max_attempt = 3;
    return o;
  };
  Node a(heartbeating("node-a"));
  Node b(heartbeating("node-b"));
  join_in_order(a, 1, obs, 0);
  join_in_order(b, 1, obs, 0);  // arrival number MAX: ends a's last call
  RendezvousInfo ia = a.info(), ib = b.info();
  REQUIRE(ia.group_world_size == 2);
  REQUIRE(ia.group_rank == 0);
  REQUIRE(ib.group_rank == 1);

  // Both watchers run, as the agents' watcher threads do: they heartbeat in wait_round_stopped.
  std::atomic<bool> b_alive{true};
  auto watch = [](DynamicRendezvous& r, const std::atomic<bool>& alive) {
    auto deadline = Clock::now() + kLimit;
    while (alive && Clock::now() < deadline) {
      if (auto stop = r.wait_round_stopped(100ms)) return stop;
    }
    return std::optional<RoundStop>();
  };
  const std::atomic<bool> a_alive{true};
  auto a_watch = std::async(std::launch::async, watch, std::ref(*a.rdzv), std::cref(a_alive));
  auto b_watch = std::async(std::launch::async, watch, std::ref(*b.rdzv), std::cref(b_alive));
  REQUIRE(eventually([&] { return obs.add(rkey(0, "hb/1"), 0) >= 2; }));
  CHECK(a.rdzv->lost_nodes().empty());  // b heartbeats

  b_alive = false;  // node b freezes: no more heartbeats, its connection stays open
  REQUIRE(b_watch.wait_for(kLimit) == std::future_status::ready);
  CHECK_FALSE(b_watch.get());
  CHECK(a.rdzv->lost_nodes().empty());  // a frozen agent's connection is open: only its heartbeats tell
  REQUIRE(a_watch.wait_for(kLimit) == std::future_status::ready);
  auto stop = a_watch.get();
  REQUIRE(stop);
  CHECK(stop->kind == RoundStop::Kind::kMembership);
  CHECK(stop->node_rank == 0);
  CHECK_THAT(stop->detail, Catch::StartsWith("node 1 stopped heartbeating"));
  CHECK(obs.check({rkey(0, "lost/1")}));  // for the next round's closer: b is not waited for

  a.join(1);
  RendezvousInfo a1 = a.info();
  CHECK(a1.round == 1);
  CHECK(a1.group_world_size == 1);
  CHECK(a1.group_rank == 0);
  CHECK(a1.world_size == 1);
}

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: once every node is done the round stops as done, a closed rendezvous turns late agents "
    "away",
    "[c10d][integration]") {
  auto pair = form_pair(*this, obs);
  Node &a = pair->a, &b = pair->b;
  REQUIRE(pair->ia.round == 0);
  REQUIRE(pair->ib.round == 0);
  a.rdzv->node_done();
  CHECK_FALSE(a.rdzv->wait_round_stopped(0ms));  // one of two nodes done
  b.rdzv->node_done();
  auto stop = a.rdzv->wait_round_stopped(kLimit);
  REQUIRE(stop);
  CHECK(stop->kind == RoundStop::Kind::kDone);
  CHECK(stop->node_rank == 1);  // the last node done stops the round
  CHECK_FALSE(a.rdzv->is_closed());
  a.rdzv->set_closed();
  CHECK(b.rdzv->is_closed());
  b.rdzv->shutdown();
  a.rdzv->shutdown();
  CHECK(obs.get(rkey(0, "left_all")) == "1");

  Node late(options("node-c", 2, 2));
  REQUIRE(late.rdzv->is_closed());
  late.join(1);
  REQUIRE(late.ready());
  REQUIRE_THROWS_AS(late.round.get(), RendezvousClosedError);
  Node later(options("node-d", 2, 2));
  REQUIRE_THROWS_WITH(later.rdzv->next_rendezvous(1),
                      Catch::Contains("rendezvous 'job' at 127.0.0.1:" + std::to_string(server.port()) +
                                      " is closed: the job already finished"));
}

}  // namespace ddprun::rdzv
