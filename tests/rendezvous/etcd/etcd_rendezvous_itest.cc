// Integration tests of EtcdRendezvous (--rdzv_backend etcd: torch's etcd protocol) and of the dynamic
// rendezvous on etcd (etcd-v2), each participant a thread of this process with its own handler, against a
// real etcd member (EtcdProcess). Sub-second last calls; every wait bounded. torchrun's own agents meeting
// ddprun's in one job: tests/integration/test_etcd_netns.py.
#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "etcd_process.h"
#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/rendezvous_error.h"

namespace ddprun::rdzv::etcd {
namespace {

using namespace std::chrono_literals;
using testing::EtcdProcess;

EtcdRendezvousOptions legacy(const EtcdProcess& etcd, const std::string& run_id, int min, int max) {
  EtcdRendezvousOptions o;
  o.run_id = run_id;
  o.min_nodes = min;
  o.max_nodes = max;
  o.client = ClientOptions{.endpoints = {etcd.endpoint()}, .request_timeout = 5s};
  o.join_timeout = 30s;
  o.last_call_timeout = 300ms;
  o.local_addr = "127.0.0.1";
  return o;
}

// `n` handlers join at once with `workers` each; returns their rounds, in node-rank order.
std::vector<RendezvousInfo> join_all(std::vector<std::unique_ptr<EtcdRendezvous>>& nodes, int workers = 2) {
  std::vector<std::future<RendezvousInfo>> joins;
  for (auto& n : nodes)
    joins.push_back(std::async(std::launch::async, [&n, workers] { return n->next_rendezvous(workers); }));
  std::vector<RendezvousInfo> rounds(nodes.size());
  for (auto& j : joins) {
    RendezvousInfo info = j.get();
    REQUIRE(info.group_rank >= 0);
    REQUIRE(info.group_rank < static_cast<int>(nodes.size()));
    rounds[static_cast<size_t>(info.group_rank)] = info;
  }
  return rounds;
}

std::vector<std::unique_ptr<EtcdRendezvous>> make_nodes(const EtcdProcess& etcd, const std::string& run_id,
                                                        int n, int min, int max) {
  std::vector<std::unique_ptr<EtcdRendezvous>> nodes;
  for (int i = 0; i < n; ++i)
    nodes.push_back(std::make_unique<EtcdRendezvous>(legacy(etcd, run_id, min, max)));
  return nodes;
}

TEST_CASE("etcd: three nodes meet with distinct ranks and one workers' store", "[etcd][rendezvous]") {
  EtcdProcess etcd;
  auto nodes = make_nodes(etcd, "three", 3, 3, 3);
  auto rounds = join_all(nodes);
  std::set<int> base_ranks;
  for (size_t i = 0; i < rounds.size(); ++i) {
    CHECK(rounds[i].group_world_size == 3);
    CHECK(rounds[i].world_size == 6);
    CHECK(rounds[i].base_rank == 2 * static_cast<int>(i));
    CHECK_FALSE(rounds[i].agent_store);  // the workers' rank 0 hosts their store, as under torchrun
    CHECK(rounds[i].store_host == "127.0.0.1");
    CHECK(rounds[i].store_port == rounds[0].store_port);
    CHECK(rounds[i].round == 0);
  }
  CHECK(rounds[0].store_port != 0);
  // The state torch's agents read: final, three keep-alives, nobody waiting.
  Client raw({.endpoints = {etcd.endpoint()}});
  const std::string state = raw.get("/torchelastic/p2p/run_three/rdzv/active_version").node.value;
  CHECK_THAT(state, Catch::Contains("\"status\":\"final\""));
  CHECK_THAT(state, Catch::Contains("/torchelastic/p2p/run_three/rdzv/v_1/rank_2"));
}

TEST_CASE("etcd: MIN nodes form a round after the last call", "[etcd][rendezvous]") {
  EtcdProcess etcd;
  auto nodes = make_nodes(etcd, "elastic", 2, 2, 4);
  auto rounds = join_all(nodes, 1);
  CHECK(rounds[0].group_world_size == 2);
  CHECK(rounds[1].world_size == 2);
}

TEST_CASE("etcd: a stop reaches every node; a restart forms the next version at once", "[etcd][rendezvous]") {
  EtcdProcess etcd;
  auto nodes = make_nodes(etcd, "restart", 2, 2, 2);
  join_all(nodes);
  CHECK_FALSE(nodes[0]->wait_round_stopped(50ms).has_value());
  RoundStop failed{
      .kind = RoundStop::Kind::kFailed, .node_rank = 1, .detail = "rank 3 exit code 1", .exit_code = 1};
  CHECK(nodes[1]->stop_round(failed).kind == RoundStop::Kind::kFailed);
  auto seen = nodes[0]->wait_round_stopped(5s);
  REQUIRE(seen.has_value());
  CHECK(seen->kind == RoundStop::Kind::kFailed);
  CHECK(seen->detail == "rank 3 exit code 1");
  // Both re-join: the old round's keep-alives are deleted, not left to expire (10 s): no wait.
  const auto started = std::chrono::steady_clock::now();
  auto rounds = join_all(nodes);
  CHECK(std::chrono::steady_clock::now() - started < 8s);  // bound: under the keep-alive TTL
  CHECK(rounds[0].round == 1);
  Client raw({.endpoints = {etcd.endpoint()}});
  CHECK_THAT(raw.get("/torchelastic/p2p/run_restart/rdzv/active_version").node.value,
             Catch::Contains("\"version\":\"2\""));
}

TEST_CASE("etcd: every node done ends the round as done (torch's exit barrier keys)", "[etcd][rendezvous]") {
  EtcdProcess etcd;
  auto nodes = make_nodes(etcd, "done", 2, 2, 2);
  join_all(nodes);
  nodes[0]->node_done();
  CHECK_FALSE(nodes[1]->wait_round_stopped(50ms).has_value());
  nodes[1]->node_done();
  for (auto& n : nodes) {
    auto stop = n->wait_round_stopped(5s);
    REQUIRE(stop.has_value());
    CHECK(stop->kind == RoundStop::Kind::kDone);
  }
  // torch 2.x's barrier key and 1.13's per-rank keys are both there.
  EtcdStore kv(std::make_shared<Client>(ClientOptions{.endpoints = {etcd.endpoint()}}),
               "/torchelastic/p2p/run_done/rdzv/v_1/kv", 1s);
  CHECK(kv.check({"torchelastic/agent/terminal_state/last_member", "torchelastic/agent/terminal_state0",
                  "torchelastic/agent/terminal_state1", "torchelastic/agent/terminal_state1.FIN"}));
}

TEST_CASE("etcd: a node that arrives at a running round with room ends it", "[etcd][rendezvous]") {
  EtcdProcess etcd;
  auto nodes = make_nodes(etcd, "grow", 2, 2, 3);
  join_all(nodes, 1);
  nodes.push_back(std::make_unique<EtcdRendezvous>(legacy(etcd, "grow", 2, 3)));
  auto late = std::async(std::launch::async, [&] { return nodes[2]->next_rendezvous(1); });
  auto stop = nodes[0]->wait_round_stopped(10s);
  REQUIRE(stop.has_value());
  CHECK(stop->kind == RoundStop::Kind::kMembership);
  CHECK_THAT(stop->detail, Catch::Contains("wait to join"));
  auto again = std::async(std::launch::async, [&] { return nodes[0]->next_rendezvous(1); });
  RendezvousInfo mine = nodes[1]->next_rendezvous(1);
  CHECK(mine.group_world_size == 3);
  CHECK(again.get().group_world_size == 3);
  CHECK(late.get().world_size == 3);
}

TEST_CASE("etcd: the watcher rides out etcd back within read_timeout, and reports one gone for longer",
          "[etcd][rendezvous]") {
  EtcdProcess etcd;
  EtcdRendezvousOptions o = legacy(etcd, "blip", 1, 1);
  o.client.request_timeout = 5s;  // read_timeout
  EtcdRendezvous node(o);
  node.next_rendezvous(1);
  etcd.kill();
  CHECK_FALSE(node.wait_round_stopped(300ms).has_value());  // silent: not yet a failure
  etcd.restart();                                           // back (same ports and data) within the 5 s
  CHECK_FALSE(node.wait_round_stopped(300ms).has_value());
  etcd.kill();
  const auto lost = std::chrono::steady_clock::now();
  try {
    while (std::chrono::steady_clock::now() - lost < 30s) node.wait_round_stopped(500ms);
    FAIL("etcd gone for 30 s was not reported");
  } catch (const RendezvousStoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("etcd did not answer for 5 s (read_timeout)"));
    CHECK_THAT(e.what(), Catch::Contains(etcd.endpoint().to_string()));
  }
  CHECK(std::chrono::steady_clock::now() - lost < 15s);  // bound: read_timeout plus one request
}

TEST_CASE("etcd: closed rendezvous, foreign state, other runs untouched", "[etcd][rendezvous]") {
  EtcdProcess etcd;
  Client raw({.endpoints = {etcd.endpoint()}});
  // Another job's keys: the same prefix, another run id. Nothing of it may change.
  raw.write("/torchelastic/p2p/run_other/rdzv/active_version", R"({"status": "final", "version": "7"})");
  const uint64_t other_index = raw.get("/torchelastic/p2p/run_other/rdzv/active_version").node.modified_index;

  auto nodes = make_nodes(etcd, "closing", 1, 1, 1);
  join_all(nodes, 1);
  nodes[0]->set_closed();
  CHECK(nodes[0]->is_closed());
  EtcdRendezvous late(legacy(etcd, "closing", 1, 1));
  CHECK_THROWS_AS(late.next_rendezvous(1), RendezvousClosedError);

  raw.write("/torchelastic/p2p/run_garbage/rdzv/active_version", "<html>not json</html>");
  EtcdRendezvous garbage(legacy(etcd, "garbage", 1, 1));
  try {
    garbage.next_rendezvous(1);
    FAIL("joined a foreign state");
  } catch (const RendezvousStoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("/torchelastic/p2p/run_garbage/rdzv/active_version"));
    CHECK_THAT(e.what(), Catch::Contains("<html>not json</html>"));
    CHECK_THAT(e.what(), Catch::Contains("--rdzv_id garbage"));
  }
  CHECK(raw.get("/torchelastic/p2p/run_other/rdzv/active_version").node.modified_index == other_index);
}

TEST_CASE("etcd: an endpoint where nothing listens is named in the error", "[etcd][rendezvous]") {
  EtcdRendezvousOptions o;
  o.run_id = "nobody";
  o.client = ClientOptions{.endpoints = {{"127.0.0.1", testing::free_port()}}, .request_timeout = 1s};
  try {
    EtcdRendezvous r(o);
    FAIL("no error");
  } catch (const RendezvousStoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains(o.client.endpoints[0].to_string()));
  }
}

TEST_CASE("etcd-v2: ddprun's dynamic rendezvous with etcd as its store", "[etcd][rendezvous]") {
  EtcdProcess etcd;
  auto options = [&](const std::string& id) {
    DynamicRendezvousOptions o;
    o.run_id = "v2";
    o.min_nodes = 2;
    o.max_nodes = 3;
    o.identity = id;
    o.endpoint_host = "127.0.0.1";
    o.endpoint_port = etcd.endpoint().port;
    o.local_addr = "127.0.0.1";
    o.join_timeout = 30s;
    o.last_call_timeout = 300ms;
    o.keep_alive_interval = 1s;
    o.keep_alive_max_attempt = 30;
    o.read_timeout = 5s;
    const Endpoint at = etcd.endpoint();
    o.external_store = [at](std::chrono::milliseconds request) -> std::unique_ptr<Store> {
      auto client = std::make_shared<Client>(ClientOptions{.endpoints = {at}, .request_timeout = request});
      return std::make_unique<EtcdStore>(client, "/ddprun/etcd-v2/run_v2", request);
    };
    o.external_name = "etcd at " + at.to_string();
    return o;
  };
  DynamicRendezvous a(options("a")), b(options("b"));
  auto ja = std::async(std::launch::async, [&] { return a.next_rendezvous(2); });
  RendezvousInfo ib = b.next_rendezvous(1);
  RendezvousInfo ia = ja.get();
  CHECK(ia.world_size == 3);
  CHECK(ib.world_size == 3);
  CHECK(ia.group_rank != ib.group_rank);
  CHECK_FALSE(ia.agent_store);
  CHECK(ia.store_port == ib.store_port);
  CHECK(ia.store_port != 0);
  b.stop_round(
      RoundStop{.kind = RoundStop::Kind::kFailed, .node_rank = ib.group_rank, .detail = "x", .exit_code = 1});
  auto seen = a.wait_round_stopped(5s);
  REQUIRE(seen.has_value());
  CHECK(seen->kind == RoundStop::Kind::kFailed);
}

}  // namespace
}  // namespace ddprun::rdzv::etcd
