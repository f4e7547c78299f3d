// Integration tests of DynamicRendezvous's recovery (issue 37): a restart round closes as soon as the
// previous round's living nodes are back, a dead agent is known by its connection, spares take a lost node's
// rank, and the cooldown of a failing node (with a spare at MIN = MAX). Participants are threads of this
// process against one store on 127.0.0.1 (c10d_fixture.h); every wait is bounded by kLimit.
#include <string>
#include <vector>

#include "c10d_fixture.h"
#include "catch_compat.h"

namespace ddprun::rdzv {

using namespace std::chrono_literals;
using namespace testing;
using namespace c10d_testing;

// The closer of a restart round waits for nothing but the previous round's living nodes: with a last call far
// beyond kLimit, every join here returns at once or the test fails.
TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: a restart closes as soon as the previous round's living nodes are back; a node "
    "whose agent is gone is not waited for, and its rank goes to a spare",
    "[c10d][integration]") {
  auto no_last_call = [&](const std::string& id, int min, int max) {
    auto o = options(id, min, max);
    o.last_call_timeout = 60s;
    return o;
  };
  Node a(no_last_call("node-a", 2, 3));
  Node b(no_last_call("node-b", 2, 3));
  Node c(no_last_call("node-c", 2, 3));
  join_in_order(a, 1, obs, 0);
  join_in_order(b, 1, obs, 0);
  join_in_order(c, 1, obs, 0);  // MAX joined: round 0 closes
  const int rank_c = c.info().group_rank;
  REQUIRE(a.info().group_world_size == 3);
  REQUIRE(b.info().group_rank == 1);

  SECTION("a restart: the round closes when all three are back, ranks unchanged") {
    a.rdzv->stop_round(RoundStop{RoundStop::Kind::kFailed, 0, "rank 0 failed", 1});
    join_in_order(c, 1, obs, 1);
    join_in_order(a, 1, obs, 1);  // the closer (arrival MIN): waits for b, alive
    CHECK_FALSE(a.ready(300ms));
    join_in_order(b, 1, obs, 1);
    for (Node* n : {&a, &b, &c}) REQUIRE(n->ready(5s));
    RendezvousInfo ia = a.info(), ib = b.info(), ic = c.info();
    CHECK(ia.round == 1);
    CHECK(ia.group_world_size == 3);
    CHECK(ia.group_rank == 0);
    CHECK(ib.group_rank == 1);
    CHECK(ic.group_rank == rank_c);
    CHECK(ia.dropped_nodes.empty());
  }
  SECTION("c's agent dies: its live key goes with its connection, the survivors close without it") {
    CHECK(obs.check({"ddprun/" + kRunId + "/live/node-c"}));
    c.rdzv.reset();  // the agent's process ends: its connections close
    REQUIRE(eventually([&] { return !obs.check({"ddprun/" + kRunId + "/live/node-c"}); }));
    CHECK(a.rdzv->lost_nodes() == std::vector<int>{rank_c});
    a.rdzv->stop_round(RoundStop{RoundStop::Kind::kFailed, 0, "gloo: connection reset by peer", 1});

    SECTION("without a spare: 2 of MIN 2, at once") {
      join_in_order(b, 1, obs, 1);
      join_in_order(a, 1, obs, 1);
      for (Node* n : {&a, &b}) REQUIRE(n->ready(5s));
      RendezvousInfo ia = a.info(), ib = b.info();
      CHECK(ia.group_world_size == 2);
      CHECK(ia.group_rank == 0);
      CHECK(ib.group_rank == 1);
      CHECK(ia.dropped_nodes == std::vector<std::string>{"node-c"});
    }
    SECTION("a spare that arrives first takes c's rank; a second spare waits") {
      Node s1(no_last_call("spare-1", 2, 3));
      Node s2(no_last_call("spare-2", 2, 3));
      join_in_order(s1, 1, obs, 1);
      join_in_order(s2, 1, obs, 1);  // the closer: a and b are alive and not back yet
      CHECK_FALSE(s2.ready(300ms));
      join_in_order(a, 1, obs, 1);
      join_in_order(b, 1, obs, 1);
      for (Node* n : {&a, &b, &s1}) REQUIRE(n->ready(5s));
      RendezvousInfo ia = a.info(), ib = b.info(), is1 = s1.info();
      CHECK(ia.group_world_size == 3);
      CHECK(ia.group_rank == 0);
      CHECK(ib.group_rank == 1);
      CHECK(is1.group_rank == rank_c);
      CHECK(ia.dropped_nodes == std::vector<std::string>{"node-c"});
      CHECK(obs.get(rkey(1, "assign/1")) == "spare");
      CHECK_FALSE(s2.ready(300ms));  // waits for round 1 to end
      a.rdzv->stop_round(RoundStop{RoundStop::Kind::kDone, 0, "done", 0});
      CHECK_THROWS_AS(s2.info(), SpareNotNeededError);  // the job finished while it waited
    }
  }
}

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: with MIN = MAX a flapping node sits out while a spare takes its place, then "
    "waits as a spare itself",
    "[c10d][integration]") {
  auto pair = form_pair(*this, obs);
  Node &a = pair->a, &b = pair->b;
  REQUIRE(pair->ia.group_rank == 0);
  REQUIRE(pair->ib.group_rank == 1);
  Node spare(options("spare", 2, 2));
  join_in_order(spare, 1, obs, 0);  // round 0 is full: it waits
  CHECK_FALSE(spare.ready(200ms));

  a.rdzv->note_local_failure();  // a's workers caused two failures
  a.rdzv->note_local_failure();
  a.rdzv->stop_round(RoundStop{RoundStop::Kind::kFailed, 0, "rank 0 failed", 1});
  a.join(1);  // sits out for cooldown_base (300 ms): a spare can take its place
  REQUIRE(eventually([&] { return obs.check({rkey(0, "lost/0")}); }));
  join_in_order(b, 1, obs, 1);
  REQUIRE(spare.ready(5s));
  REQUIRE(b.ready(5s));
  RendezvousInfo is = spare.info(), ib = b.info();
  CHECK(is.round == 1);
  CHECK(is.group_rank == 0);  // a's rank
  CHECK(ib.group_rank == 1);
  CHECK(ib.dropped_nodes.empty());  // it stood aside alive: the restart stays counted
  CHECK(obs.check({rkey(0, "aside/0")}));
  // After its cooldown a finds round 1 full and waits as a spare; the job ends meanwhile.
  REQUIRE(eventually([&] { return obs.add(rkey(1, "joined"), 0) == 3; }));
  CHECK_FALSE(a.ready(200ms));
  b.rdzv->stop_round(RoundStop{RoundStop::Kind::kDone, 1, "done", 0});
  CHECK_THROWS_AS(a.info(), SpareNotNeededError);
}

TEST_CASE_METHOD(
    C10dStore,
    "c10d rendezvous: an unhealthy node stands aside, a spare takes its rank at once, and it comes "
    "back as a spare",
    "[c10d][integration]") {
  auto pair = form_pair(*this, obs);
  Node &a = pair->a, &b = pair->b;
  REQUIRE(pair->ia.group_rank == 0);
  Node spare(options("spare", 2, 2));
  join_in_order(spare, 1, obs, 0);
  CHECK_FALSE(spare.ready(200ms));

  b.rdzv->stop_round(RoundStop{RoundStop::Kind::kFailed, 1, "rank 1 failed", 1});
  a.rdzv->stand_aside("GPU 1 is lost");  // before its join: the health check failed
  const std::string unhealthy = "ddprun/" + kRunId + "/unhealthy/node-a";
  CHECK(obs.get(unhealthy) == "GPU 1 is lost");
  CHECK(obs.check({rkey(0, "lost/0")}));
  join_in_order(b, 1, obs, 1);
  REQUIRE(spare.ready(5s));
  REQUIRE(b.ready(5s));
  RendezvousInfo is = spare.info(), ib = b.info();
  CHECK(is.group_rank == 0);  // a's rank
  CHECK(ib.group_rank == 1);
  CHECK(ib.dropped_nodes.empty());  // it stood aside alive: the restart stays counted
  CHECK(obs.check({rkey(0, "aside/0")}));

  // Healthy again, a joins: its reason is gone, and round 1 is full, so it waits as a spare.
  a.join(1);
  REQUIRE(eventually([&] { return obs.add(rkey(1, "joined"), 0) == 3; }));
  CHECK_FALSE(obs.check({unhealthy}));
  CHECK_FALSE(a.ready(200ms));
  b.rdzv->stop_round(RoundStop{RoundStop::Kind::kDone, 1, "done", 0});
  CHECK_THROWS_AS(a.info(), SpareNotNeededError);
}

TEST_CASE_METHOD(C10dStore, "c10d rendezvous: a host whose workers failed twice sits out before joining",
                 "[c10d][integration]") {
  Node a(options("node-a", 1, 2));  // elastic: others could run without it
  a.rdzv->note_local_failure();
  a.rdzv->note_local_failure();
  CHECK(obs.add("ddprun/" + kRunId + "/failures/node-a", 0) == 2);
  auto start = Clock::now();
  a.join(1);
  RendezvousInfo ia = a.info();
  CHECK(Clock::now() - start >= 300ms + 200ms);  // cooldown_base, then the last call
  CHECK(ia.group_world_size == 1);
}

TEST_CASE_METHOD(C10dStore, "c10d rendezvous: a healthy agent on the host of a failing one does not sit out",
                 "[c10d][integration]") {
  auto patient = [&](const std::string& identity) {
    auto o = options(identity, 1, 2);
    o.cooldown_base = 60s;  // a sitting-out agent would miss the join below by far
    o.cooldown_max = 60s;
    return o;
  };
  Node failing(patient("node-a"));
  failing.rdzv->note_local_failure();
  failing.rdzv->note_local_failure();
  Node healthy(patient("node-b"));  // the same host
  auto start = Clock::now();
  healthy.join(1);
  CHECK(healthy.info().group_world_size == 1);
  CHECK(Clock::now() - start < 30s);
  CHECK(obs.add("ddprun/" + kRunId + "/failures/node-b", 0) == 0);
}

}  // namespace ddprun::rdzv

namespace ddprun::rdzv {

using namespace std::chrono_literals;
using namespace testing;
using namespace c10d_testing;

// The store host's LossReporter: a member whose connection closes (a killed agent) ends the round at once as
// a membership change; a spare that dies changes nothing.
TEST_CASE("c10d rendezvous: the store host ends the round when a member's agent dies, not a spare's",
          "[c10d][integration]") {
  auto host_options = c10d(0, "node-a", 2, 2);
  host_options.is_host = true;
  Node host(host_options);
  REQUIRE(host.rdzv->hosts_store());
  const uint16_t port = host.rdzv->store_port();
  StoreClient obs("127.0.0.1", port, observer_options());
  Node b(c10d(port, "node-b", 2, 2));
  join_in_order(host, 1, obs, 0);
  join_in_order(b, 1, obs, 0);
  REQUIRE(host.info().round == 0);
  REQUIRE(b.info().round == 0);
  // A spare's agent: it arrived after the close and holds its live key; then it is killed (its connection
  // closes without a word).
  auto spare = std::make_unique<StoreClient>("127.0.0.1", port, observer_options());
  ghost_join(*spare, 0, "spare");
  spare->set("ddprun/" + kRunId + "/live/spare", "1");
  spare.reset();
  REQUIRE(eventually([&] { return !obs.check({"ddprun/" + kRunId + "/live/spare"}); }));
  CHECK_FALSE(eventually([&] { return obs.check({rkey(0, "stop")}); }, 300ms));

  b.rdzv.reset();  // a member killed
  REQUIRE(eventually([&] { return obs.check({rkey(0, "stop")}); }));
  auto stop = decode_round_stop(obs.get(rkey(0, "stop")));
  REQUIRE(stop);
  CHECK(stop->kind == RoundStop::Kind::kMembership);
  CHECK_THAT(stop->detail, Catch::Contains("node 1 lost"));
}

}  // namespace ddprun::rdzv

namespace ddprun::rdzv {

using namespace std::chrono_literals;
using namespace testing;
using namespace c10d_testing;

// The store host's agent stands aside (unhealthy) while the job runs round 1 without it: its reporter reads
// the job's round from the store, not its own last round, and still ends the round a member's death.
TEST_CASE("c10d rendezvous: the store host that sits out still ends the round when a member's agent dies",
          "[c10d][integration]") {
  auto host_options = c10d(0, "node-a", 2, 3);
  host_options.is_host = true;
  Node host(host_options);
  REQUIRE(host.rdzv->hosts_store());
  const uint16_t port = host.rdzv->store_port();
  StoreClient obs("127.0.0.1", port, observer_options());
  Node b(c10d(port, "node-b", 2, 3));
  Node c(c10d(port, "node-c", 2, 3));
  join_in_order(host, 1, obs, 0);
  join_in_order(b, 1, obs, 0);
  join_in_order(c, 1, obs, 0);
  for (Node* n : {&host, &b, &c}) REQUIRE(n->info().round == 0);

  host.rdzv->stop_round(RoundStop{RoundStop::Kind::kFailed, 0, "rank 0 failed", 1});
  host.rdzv->stand_aside("GPU 0 lost");  // it does not join round 1
  join_in_order(b, 1, obs, 1);
  join_in_order(c, 1, obs, 1);
  for (Node* n : {&b, &c}) REQUIRE(n->ready(10s));
  const RendezvousInfo ib = b.info();
  REQUIRE(ib.round == 1);
  REQUIRE(ib.group_world_size == 2);
  const int rank_c = c.info().group_rank;

  c.rdzv.reset();  // a member of round 1 killed
  REQUIRE(eventually([&] { return obs.check({rkey(1, "stop")}); }));
  const auto stop = decode_round_stop(obs.get(rkey(1, "stop")));
  REQUIRE(stop);
  CHECK(stop->kind == RoundStop::Kind::kMembership);
  CHECK_THAT(stop->detail, Catch::Contains("node " + std::to_string(rank_c) + " lost"));
}

}  // namespace ddprun::rdzv
