// The copies of training state between agents over loopback (agent/state/): two keepers of a 2-node round
// (each the other's buddy) behind a real store with the job's secret; a version a worker commits on node 0
// reaches node 1's replica/; a third keeper, a spare taking node 0's place in the next round, restores it
// before its workers would start. And the refusals: a client with another secret or none, a copy whose
// CRC-32C differs from the sender's.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <set>

#include "agent/state/crc32c.h"
#include "agent/state/state_connection.h"
#include "agent/state/state_keeper.h"
#include "agent/state/state_server.h"
#include "catch_compat.h"
#include "eventually.h"
#include "rendezvous/auth/hmac_auth.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/util/state_format.h"
#include "temp_dir.h"

using namespace ddprun;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

agent::AgentConfig node_config(const fs::path& dir) {
  agent::AgentConfig c;
  c.workers.resize(2);
  c.state.memory = 64 << 20;
  c.state.dir = dir;
  c.state.advertise_addr = "127.0.0.1";
  return c;
}

rdzv::RendezvousInfo round_of(int round, int node, int nodes) {
  rdzv::RendezvousInfo r;
  r.round = round;
  r.group_rank = node;
  r.group_world_size = nodes;
  r.base_rank = 2 * node;
  r.world_size = 2 * nodes;
  return r;
}

// A committed version of `rank` at `step` in `dir` (as a worker writes it: a temporary file, renamed).
void commit_version(const fs::path& dir, int rank, int64_t step, size_t payload_bytes) {
  Manifest m;
  m.step = step;
  m.rank = rank;
  m.world_size = 4;
  m.payload = payload_bytes;
  m.writer = "test";
  m.tensors.push_back(
      {.offset = 0, .nbytes = payload_bytes, .dtype = "uint8", .shape = {int64_t(payload_bytes)}});
  const fs::path tmp = dir / ("." + version_file_name({rank, step}) + ".1.tmp");
  {
    std::ofstream out(tmp, std::ios::binary);
    for (size_t i = 0; i < payload_bytes; ++i) out.put(static_cast<char>(i * 31 + step));
    out << manifest_trailer(m);
  }
  fs::rename(tmp, dir / version_file_name({rank, step}));
}

// Two nodes of 2 ranks each (round 0: node 0 has ranks 0-1, node 1 ranks 2-3, node 1 keeps node 0's copies)
// against a store of their own, and a spare's configuration. Each keeper keeps a reference to its
// configuration: the configurations are declared first, so they outlive the keepers.
struct TwoNodes {
  explicit TwoNodes(std::shared_ptr<rdzv::StoreAuth> auth = nullptr)
      : store(rdzv::StoreServerOptions{.host = "127.0.0.1", .auth = auth}),
        access{.host = "127.0.0.1", .port = store.port(), .auth = auth, .run_id = "job", .identity = ""} {
    node0->before_spawn(round_of(0, 0, 2), access);
    node1.before_spawn(round_of(0, 1, 2), access);
  }
  // Node 0 is lost; a spare takes its place (node rank 0) in round 1. The agents of a round start their
  // generations together: each publishes what it holds, then waits for the others' documents.
  std::unique_ptr<agent::StateKeeper> spare_for_node0() {
    node0.reset();
    auto spare = std::make_unique<agent::StateKeeper>(c2);
    auto node1_round1 =
        std::async(std::launch::async, [&] { node1.before_spawn(round_of(1, 1, 2), access); });
    spare->before_spawn(round_of(1, 0, 2), access);
    node1_round1.get();
    return spare;
  }

  testing::TempDir tmp;
  rdzv::StoreServerThread store;
  const rdzv::StoreAccess access;
  const agent::AgentConfig c0 = node_config(tmp.path / "n0"), c1 = node_config(tmp.path / "n1"),
                           c2 = node_config(tmp.path / "spare");
  std::unique_ptr<agent::StateKeeper> node0 = std::make_unique<agent::StateKeeper>(c0);
  agent::StateKeeper node1{c1};
};

}  // namespace

TEST_CASE("state: a committed version reaches the buddy and a spare restores it from there",
          "[agent][state]") {
  TwoNodes nodes(std::make_shared<rdzv::HmacAuth>("a secret of the job, 32 bytes..."));
  auto& node0 = nodes.node0;
  auto& node1 = nodes.node1;

  commit_version(node0->directory().own(), 1, 10, 300000);
  commit_version(node0->directory().own(), 1, 20, 300000);  // may supersede step 10 before its turn
  REQUIRE(testing::eventually([&] {
    const auto v = agent::StateDirectory::newest(node1.directory().replica(), 1);
    return v && v->name.step == 20;
  }));
  CHECK(agent::StateDirectory::versions(node1.directory().replica()).size() <= 2);  // the two newest at most
  REQUIRE(testing::eventually([&] { return node0->stats().ranks.at(1).replica_step == 20; }));
  CHECK(node0->stats().ranks.at(1).step == 20);
  CHECK_FALSE(node0->stats().ranks.at(0).step.has_value());

  // Node 0 is lost; a spare takes its place (node 1 has no version of its own ranks either, so it waits for
  // the spare's document too).
  const auto spare_keeper = nodes.spare_for_node0();
  const agent::StateKeeper& spare = *spare_keeper;
  const auto restored = agent::StateDirectory::newest(spare.directory().own(), 1);
  REQUIRE(restored.has_value());
  CHECK(restored->name.step == 20);
  std::ifstream a(restored->file, std::ios::binary),
      b(node1.directory().replica() / "rank1.step20.ddps", std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(a), {}) ==
        std::string(std::istreambuf_iterator<char>(b), {}));
  CHECK_FALSE(agent::StateDirectory::newest(spare.directory().own(), 0).has_value());  // nobody had rank 0's
}

TEST_CASE("state: the server refuses another job's agent and a copy whose CRC differs", "[agent][state]") {
  testing::TempDir tmp;
  agent::StateDirectory dir(tmp.path / "n1");
  auto auth = std::make_shared<rdzv::HmacAuth>("a secret of the job, 32 bytes...");
  agent::StateServer server(dir, "127.0.0.1", auth, 64 << 20);

  rdzv::HmacAuth other("another job's secret, 32 bytes.");
  auto stranger = agent::StateConnection::connect("127.0.0.1", server.port(), 5s, 5s);
  CHECK_THROWS_WITH(stranger.client_handshake(&other), Catch::Contains("not this job's agent"));
  auto open = agent::StateConnection::connect("127.0.0.1", server.port(), 5s, 5s);
  CHECK_THROWS_WITH(open.client_handshake(nullptr), Catch::Contains("asks for the job's secret"));

  CHECK(server.counters().copies_received == 0);
}

TEST_CASE("state: a copy whose CRC-32C differs from the sender's is an error", "[agent][state]") {
  testing::TempDir tmp;
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd raw(sv[1]);
  agent::StateConnection receiver(UniqueFd{sv[0]}, "test peer", 5s);
  const std::string payload = "version bytes";
  auto send_raw = [&](uint32_t crc) {
    const std::string done = agent::encode_message({.kind = agent::StateMessage::Kind::kDone, .crc = crc});
    const std::string all = payload + agent::frame_header(static_cast<uint32_t>(done.size())) + done;
    REQUIRE(::write(raw.get(), all.data(), all.size()) == static_cast<ssize_t>(all.size()));
  };
  const fs::path file = tmp.path / "copy";
  UniqueFd fd(::open(file.c_str(), O_RDWR | O_CREAT, 0600));
  send_raw(agent::crc32c(0, payload.data(), payload.size()) ^ 1);
  CHECK_THROWS_WITH(receiver.receive_file(fd.get(), payload.size()),
                    Catch::Contains("differs from the sender's"));
  send_raw(agent::crc32c(0, payload.data(), payload.size()));
  receiver.receive_file(fd.get(), payload.size());
  CHECK(fs::file_size(file) == payload.size());
}

// Node 0 (ranks 0, 1) and node 1 (ranks 2, 3): both of node 0's ranks commit step 10 and reach the buddy
// (node 1); then rank 0 commits step 20, which reaches it too, and node 0 is lost before rank 1's step 20
// does. `survivor_steps`: what node 1's own ranks have committed meanwhile. Returns the steps of ranks 0 and
// 1 that a spare taking node 0's place restores.
std::pair<std::set<int64_t>, std::set<int64_t>> spare_after_a_loss_between_copies(
    const std::vector<int64_t>& survivor_steps) {
  TwoNodes nodes;
  auto& node0 = nodes.node0;
  for (int rank : {0, 1}) commit_version(node0->directory().own(), rank, 10, 1000);
  REQUIRE(testing::eventually([&] { return node0->stats().ranks.at(1).replica_step == 10; }));
  REQUIRE(testing::eventually([&] { return node0->stats().ranks.at(0).replica_step == 10; }));
  commit_version(node0->directory().own(), 0, 20, 1000);
  REQUIRE(testing::eventually([&] { return node0->stats().ranks.at(0).replica_step == 20; }));
  for (int64_t step : survivor_steps) {
    for (int rank : {2, 3}) commit_version(nodes.node1.directory().own(), rank, step, 1000);
  }
  const auto spare = nodes.spare_for_node0();
  std::set<int64_t> steps0, steps1;
  for (const auto& v : agent::StateDirectory::versions(spare->directory().own()))
    (v.name.rank == 0 ? steps0 : steps1).insert(v.name.step);
  return {steps0, steps1};
}

TEST_CASE("state: a node lost between its ranks' copies: the spare's ranks still share a step",
          "[agent][state]") {
  // Node 1's ranks hold nothing: no step every rank has, so the spare takes every version the buddy holds.
  // Step 10 is there for both (the agreement's newest common step); a buddy that kept one copy per rank had
  // only rank 0's step 20 and rank 1's step 10: no step in common, every rank would start from nothing.
  const auto [steps0, steps1] = spare_after_a_loss_between_copies({});
  CHECK(steps0 == std::set<int64_t>{10, 20});
  CHECK(steps1 == std::set<int64_t>{10});
}

TEST_CASE("state: a spare fetches only the version of the step every rank has", "[agent][state]") {
  // Ranks 2 and 3 have steps 10 and 20, rank 1 only 10: the workers will agree on 10, and rank 0's step 20
  // (which their load() would delete) is not copied: half the bytes, half the time.
  const auto [steps0, steps1] = spare_after_a_loss_between_copies({10, 20});
  CHECK(steps0 == std::set<int64_t>{10});
  CHECK(steps1 == std::set<int64_t>{10});
}
