// Unit tests of the c10d backend's pure parts: who takes part in a round (select_nodes), its ranks
// (order_nodes), which endpoint hosts are this machine (is_local_host; name resolution of literals only, no
// traffic).
#include "rendezvous/c10d/dynamic_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/c10d/c10d_round.h"
#include "rendezvous/reachability.h"

namespace ddprun::rdzv {

TEST_CASE("order_nodes: newcomers of a first round are ranked by identity", "[order_nodes]") {
  CHECK(order_nodes({}, {}).empty());
  CHECK(order_nodes({"solo"}, {-1}) == std::vector<int>{0});
  // Arrival order c, a, b: ranks by identity.
  CHECK(order_nodes({"node-c", "node-a", "node-b"}, {-1, -1, -1}) == std::vector<int>{2, 0, 1});
  // Plain string order: "node-10" sorts before "node-2".
  CHECK(order_nodes({"node-2", "node-10"}, {-1, -1}) == std::vector<int>{1, 0});
}

TEST_CASE("order_nodes: members of the previous round keep their ranks, newcomers fill the rest",
          "[order_nodes]") {
  // Previous ranks 1 and 0 survive, two newcomers arrive first; identity does not matter for members.
  std::vector<std::string> ids{"z-new", "b-member", "a-new", "y-member"};
  std::vector<int> prev{-1, 1, -1, 0};
  CHECK(order_nodes(ids, prev) == std::vector<int>{3, 1, 2, 0});

  SECTION("ranks beyond the node count (the round shrank) go to the lowest free ranks") {
    CHECK(order_nodes({"n3", "n0", "n5"}, {3, 0, 5}) == std::vector<int>{1, 0, 2});
  }
  SECTION("survivors keep their ranks; a spare takes the rank of the node it replaces") {
    // Node 1 of 3 was lost; the spare arrived first.
    CHECK(order_nodes({"spare", "n2", "n0"}, {-1, 2, 0}) == std::vector<int>{1, 2, 0});
    // Node 0 was lost: nobody is renumbered, the spare becomes node 0.
    CHECK(order_nodes({"n1", "n2", "spare"}, {1, 2, -1}) == std::vector<int>{1, 2, 0});
  }
  SECTION("two arrivals claiming the same previous rank are ordered by identity") {
    CHECK(order_nodes({"b", "a"}, {0, 0}) == std::vector<int>{1, 0});
  }
}

TEST_CASE("order_nodes returns a permutation of 0..n-1 whatever the input", "[order_nodes]") {
  auto n = GENERATE(1, 2, 5, 16);
  std::vector<std::string> ids;
  std::vector<int> prev;
  for (int i = 0; i < n; ++i) {
    ids.push_back("host-" + std::to_string((i * 7) % n));
    prev.push_back(i % 3 == 0 ? -1 : (n - i));
  }
  auto ranks = order_nodes(ids, prev);
  REQUIRE(ranks.size() == static_cast<size_t>(n));
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> expected(static_cast<size_t>(n));
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(sorted == expected);
  // A member keeps its previous rank where it exists (the generator gives members distinct ones); the others
  // fill the free ranks, members that could not keep theirs before newcomers.
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (prev[i] >= 0 && prev[i] < n) CHECK(ranks[i] == prev[i]);
    for (size_t j = 0; j < ranks.size(); ++j) {
      if (prev[i] >= n && prev[j] < 0) CHECK(ranks[i] < ranks[j]);
    }
  }
}

TEST_CASE("encode_identities and decode_identities: '|'-joined, empty for none", "[c10d_round]") {
  using V = std::vector<std::string>;
  CHECK(encode_identities({}).empty());
  CHECK(decode_identities("").empty());
  CHECK(encode_identities({"h1:7", "h2:8"}) == "h1:7|h2:8");
  CHECK(decode_identities("h1:7|h2:8") == V{"h1:7", "h2:8"});
  CHECK(decode_identities("solo") == V{"solo"});
  CHECK(decode_identities("a||b") == V{"a", "", "b"});
}

TEST_CASE("select_nodes: the previous round's members first, then the others by arrival, at most MAX",
          "[select_nodes]") {
  using V = std::vector<size_t>;
  CHECK(select_nodes({}, 3).empty());
  CHECK(select_nodes({false, false}, 3) == V{0, 1});
  // Two spares came before the survivors: the survivors take part, the first spare fills the lost node's
  // place.
  CHECK(select_nodes({false, false, true, true}, 3) == V{0, 2, 3});
  CHECK(select_nodes({true, false, true, false}, 2) == V{0, 2});
  CHECK(select_nodes({false, true, false}, 1) == V{1});
  CHECK(select_nodes({true, true}, 0).empty());
}

TEST_CASE("is_local_host: loopback names and this machine's name are local, foreign addresses are not",
          "[is_local_host]") {
  CHECK(is_local_host("localhost"));
  CHECK(is_local_host("127.0.0.1"));
  CHECK(is_local_host("127.0.1.1"));
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  CHECK(is_local_host(host));
  CHECK_FALSE(is_local_host("192.0.2.1"));  // TEST-NET-1: documentation only, never assigned
  CHECK_FALSE(is_local_host("2001:db8::1"));
}

}  // namespace ddprun::rdzv
