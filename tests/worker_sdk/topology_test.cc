// Unit tests of the CPU backend's topology: peer records and host grouping, and the size of its shared
// memory.
#include "worker_sdk/src/topology.h"

#include "catch_compat.h"
#include "ddprun/process_group.h"
#include "rendezvous/util/shm_layout.h"

using namespace ddprun::sdk;

TEST_CASE("peer records round-trip and reject garbage", "[topology]") {
  PeerInfo p{3, 4242, "nodeA/boot/4026531836", "10.0.0.7", 40001};
  PeerInfo q = decode_peer(encode_peer(p), 3);
  CHECK(q.rank == 3);
  CHECK(q.pid == 4242);
  CHECK(q.host_id == p.host_id);
  CHECK(q.address == "10.0.0.7");
  CHECK(q.port == 40001);
  CHECK_THROWS_WITH(decode_peer("12\t10.0.0.1", 5), Catch::Contains("rank 5"));
  CHECK_THROWS_WITH(decode_peer("x\t10.0.0.1\t1\th", 2), Catch::Contains("pid"));
  CHECK_THROWS_WITH(decode_peer("1\t10.0.0.1\t70000\th", 2), Catch::Contains("port"));
}

TEST_CASE("ranks are grouped by host, hosts ordered by their first rank", "[topology]") {
  std::vector<PeerInfo> peers;
  const char* hosts[] = {"b", "a", "b", "c", "a"};
  for (int r = 0; r < 5; ++r) peers.push_back({r, 100 + r, hosts[r], "127.0.0.1", 1});
  Topology t = Topology::build(peers, 4);
  REQUIRE(t.num_hosts() == 3);
  CHECK(t.hosts[0] == std::vector<int>{0, 2});
  CHECK(t.hosts[1] == std::vector<int>{1, 4});
  CHECK(t.hosts[2] == std::vector<int>{3});
  CHECK(t.my_host == 1);
  CHECK(t.my_local == 1);
  CHECK_FALSE(t.is_leader());
  CHECK(t.leader_of(2) == 3);
  CHECK(t.host_of == std::vector<int>{0, 1, 0, 2, 1});
}

TEST_CASE("the detected host id is stable and names this host", "[topology]") {
  CHECK(detect_host_id() == detect_host_id());
  CHECK(detect_host_id().find('/') != std::string::npos);
}

// The agent's health check sizes /dev/shm's need with kDefaultShmSlotBytes: it must be the SDK's default.
TEST_CASE("the shared-memory segment's default slot is the one the agent checks /dev/shm for", "[topology]") {
  CHECK(ProcessGroupOptions{}.shm_slot_bytes == ddprun::kDefaultShmSlotBytes);
  const ddprun::ShmLayout layout(8, ddprun::kDefaultShmSlotBytes);
  CHECK(layout.total_bytes >= 8 * 2 * ddprun::ShmLayout::kSmallBytes + 4 * 9 * ddprun::kDefaultShmSlotBytes);
}
