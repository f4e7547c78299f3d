// Unit tests of the c10d backend's pure parts: the rank order of a round (order_nodes) and which endpoint
// hosts are this machine (is_local_host; name resolution of literals only, no traffic).
#include "rendezvous/dynamic_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/c10d_round.h"
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

TEST_CASE("order_nodes: members of the previous round keep their order, newcomers follow", "[order_nodes]") {
  // Previous ranks 1 and 0 survive, two newcomers arrive first; identity does not matter for members.
  std::vector<std::string> ids{"z-new", "b-member", "a-new", "y-member"};
  std::vector<int> prev{-1, 1, -1, 0};
  CHECK(order_nodes(ids, prev) == std::vector<int>{3, 1, 2, 0});

  SECTION("gaps in the previous ranks (a node was lost) close up") {
    CHECK(order_nodes({"n3", "n0", "n5"}, {3, 0, 5}) == std::vector<int>{1, 0, 2});
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
  // Every member ranks before every newcomer.
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (prev[static_cast<size_t>(i)] >= 0 && prev[static_cast<size_t>(j)] < 0) {
        CHECK(ranks[static_cast<size_t>(i)] < ranks[static_cast<size_t>(j)]);
      }
    }
  }
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
