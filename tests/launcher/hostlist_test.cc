// Slurm hostlist expansion, case by case. Expected values are what `scontrol show hostnames` prints for the
// same input (Slurm 22.05).
#include <catch2/catch.hpp>

#include "launcher/hostlist.h"

using ddprun::launcher::expand_hostlist;
using ddprun::launcher::expand_tasks_per_node;
using Hosts = std::vector<std::string>;

TEST_CASE("hostlists expand as scontrol show hostnames does") {
  auto [list, expected] = GENERATE(table<std::string, Hosts>({
      {"n1", {"n1"}},
      {"a,b,c", {"a", "b", "c"}},
      {"node[01-04,07]", {"node01", "node02", "node03", "node04", "node07"}},
      {"linux[1,2]", {"linux1", "linux2"}},
      {"nodeA,nodeB[001,003]", {"nodeA", "nodeB001", "nodeB003"}},
      {"node[9-11]", {"node9", "node10", "node11"}},
      {"node[09-11]", {"node09", "node10", "node11"}},
      {"rack[1-2]-n[01-02]", {"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}},
      {"gpu-a100-[1-3]", {"gpu-a100-1", "gpu-a100-2", "gpu-a100-3"}},
      {"my-node-x,c[5-6]-ib", {"my-node-x", "c5-ib", "c6-ib"}},
      {"h[0]", {"h0"}},
      {"[1-2]x", {"1x", "2x"}},
  }));
  std::string error;
  auto hosts = expand_hostlist(list, error);
  INFO(list << ": " << error);
  REQUIRE(hosts);
  CHECK(*hosts == expected);
}

TEST_CASE("bad hostlists are refused with a reason") {
  auto [list, why] = GENERATE(table<std::string, std::string>({
      {"", "empty"},
      {"node[1-2", "missing ']'"},
      {"node1-2]", "unbalanced ']'"},
      {"node[2-1]", "backwards"},
      {"node[a-b]", "bad range"},
      {"node[1-]", "bad range"},
      {"node[[1]]", "nested"},
      {"a,,b", "empty host"},
      {"n[0-99999999]", "too large"},
  }));
  std::string error;
  INFO(list);
  CHECK_FALSE(expand_hostlist(list, error));
  CHECK_THAT(error, Catch::Contains(why));
}

TEST_CASE("SLURM_TASKS_PER_NODE expands counts and repetitions") {
  std::string error;
  CHECK(*expand_tasks_per_node("2(x3),1", error) == std::vector<int>{2, 2, 2, 1});
  CHECK(*expand_tasks_per_node("4", error) == std::vector<int>{4});
  CHECK(*expand_tasks_per_node("1,2(x2)", error) == std::vector<int>{1, 2, 2});
  for (std::string bad : {"", "x", "2(x)", "2(x0)", "2(3)", "2(x3", "1,,2"}) {
    INFO(bad);
    CHECK_FALSE(expand_tasks_per_node(bad, error));
  }
}
