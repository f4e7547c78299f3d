// Unit tests of rendezvous/c10d/c10d_round: the c10d round's two records, byte for byte, and the closer's rank
// assignment. No store, no sockets.
#include "rendezvous/c10d/c10d_round.h"

#include <string>
#include <vector>

#include "catch_compat.h"

namespace ddprun::rdzv {
namespace {

NodeDescriptor node(const std::string& identity, int previous, int lws, const std::string& standby = "") {
  return NodeDescriptor{
      .identity = identity, .previous_rank = previous, .local_world_size = lws, .standby = standby};
}

}  // namespace

TEST_CASE("c10d round: a node descriptor is identity|previous rank|local world size|standby",
          "[c10d_round]") {
  CHECK(encode(node("host:12", -1, 8, "10.0.0.1:29401")) == "host:12|-1|8|10.0.0.1:29401");
  CHECK(encode(node("host:12", 3, 1)) == "host:12|3|1|");
  UnreadableField why;
  CHECK(decode_node_descriptor("host:12|-1|8|10.0.0.1:29401", why) ==
        node("host:12", -1, 8, "10.0.0.1:29401"));
  CHECK(decode_node_descriptor("ghost|-1|1|", why) == node("ghost", -1, 1));
  CHECK(identity_of("host:12|-1|8|") == "host:12");
  CHECK(identity_of("garbage") == "garbage");

  SECTION("what cannot be read is named") {
    CHECK_FALSE(decode_node_descriptor("a|b|c", why));
    CHECK(why.what == "node descriptor");
    CHECK(why.text == "a|b|c");
    CHECK_FALSE(decode_node_descriptor("a|-2|1|", why));
    CHECK(why.what == "previous node rank");
    CHECK(why.text == "-2");
    CHECK_FALSE(decode_node_descriptor("a|0|x|", why));
    CHECK(why.what == "local world size");
    CHECK(why.text == "x");
  }
}

TEST_CASE("c10d round: a rank assignment is rank|nodes|base|world|successors", "[c10d_round]") {
  RankAssignment a{.node_rank = 1,
                   .nodes = 2,
                   .base_rank = 8,
                   .world_size = 12,
                   .successors = {.without_standby = 1, .endpoints = {Endpoint{"10.0.0.2", 29401}}}};
  CHECK(encode(a) == "1|2|8|12|1|10.0.0.2:29401");
  UnreadableField why;
  auto back = decode_rank_assignment("1|2|8|12|1|10.0.0.2:29401", why);
  REQUIRE(back);
  CHECK(back->node_rank == 1);
  CHECK(back->nodes == 2);
  CHECK(back->base_rank == 8);
  CHECK(back->world_size == 12);
  CHECK(back->successors.without_standby == 1);
  CHECK(back->successors.endpoints == std::vector<Endpoint>{Endpoint{"10.0.0.2", 29401}});
  CHECK(decode_rank_assignment("0|1|0|4|1|", why));  // no successor

  SECTION("what cannot be read is named") {
    CHECK_FALSE(decode_rank_assignment("0|1|0|4", why));
    CHECK(why.what == "rank assignment");
    CHECK_FALSE(decode_rank_assignment("0|1|0|4|x|", why));
    CHECK(why.what == "rank assignment");
    CHECK_FALSE(decode_rank_assignment("0|0|0|4|1|", why));
    CHECK(why.what == "node count");
    CHECK(why.text == "0");
    CHECK_FALSE(decode_rank_assignment("0|1|-1|4|1|", why));
    CHECK(why.what == "base rank");
  }
}

TEST_CASE("c10d round: the closer ranks members first, then newcomers by identity; bases follow the ranks",
          "[c10d_round]") {
  // Arrival order: a newcomer, the previous round's rank 1, another newcomer, the previous rank 0.
  const std::vector<NodeDescriptor> nodes{node("z-new", -1, 1, "10.0.0.1:1"), node("b-member", 1, 2),
                                          node("a-new", -1, 4, "10.0.0.3:3"),
                                          node("y-member", 0, 8, "10.0.0.4:4")};
  const auto a = assign_ranks(nodes);
  REQUIRE(a.size() == 4);
  // Ranks: y-member 0 (8 workers), b-member 1 (2), a-new 2 (4), z-new 3 (1).
  CHECK(a[0].node_rank == 3);
  CHECK(a[1].node_rank == 1);
  CHECK(a[2].node_rank == 2);
  CHECK(a[3].node_rank == 0);
  CHECK(a[3].base_rank == 0);
  CHECK(a[1].base_rank == 8);
  CHECK(a[2].base_rank == 10);
  CHECK(a[0].base_rank == 14);
  for (const auto& x : a) {
    CHECK(x.nodes == 4);
    CHECK(x.world_size == 15);
    CHECK(x.successors.without_standby == 1);  // b-member has no standby
    CHECK(x.successors.endpoints ==
          std::vector<Endpoint>{Endpoint{"10.0.0.4", 4}, Endpoint{"10.0.0.3", 3}, Endpoint{"10.0.0.1", 1}});
  }
}

TEST_CASE("c10d round: at most kSuccessors successors, in node-rank order", "[c10d_round]") {
  std::vector<NodeDescriptor> nodes;
  for (int i = 0; i < 6; ++i)
    nodes.push_back(node("n" + std::to_string(i), -1, 1, "10.0.0.9:" + std::to_string(i + 1)));
  const auto a = assign_ranks(nodes);
  REQUIRE(a.size() == 6);
  CHECK(a[0].successors.without_standby == 0);
  REQUIRE(a[0].successors.endpoints.size() == StoreFailover::kSuccessors);
  CHECK(a[0].successors.endpoints.front().port == 1);
  CHECK(a[5].base_rank == 5);
}

TEST_CASE("rank_layout: base ranks add up the nodes before, the world all of them", "[c10d_round]") {
  CHECK(rank_layout({}).world_size == 0);
  const RankLayout l = rank_layout({2, 3, 1});
  CHECK(l.base_ranks == std::vector<int>{0, 2, 5});
  CHECK(l.world_size == 6);
}

}  // namespace ddprun::rdzv
