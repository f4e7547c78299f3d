// Slurm hostlist expansion, case by case.
//
// The first table is Slurm's own answer: every row is what `scontrol show hostnames '<list>'` printed with
// Slurm 22.05 (Debian bookworm's slurm-wlm). tests/integration/test_slurm.py reads the rows of that table
// back from this file (between the BEGIN/END markers) and checks them against the scontrol installed, so keep
// each row in the form {"list", {"host", ...}}, . The other tables are where ddprun deliberately differs
// (hostlist.h says why).
#include "launcher/hostlist.h"

#include "catch_compat.h"

using ddprun::launcher::expand_hostlist;
using ddprun::launcher::expand_tasks_per_node;
using Hosts = std::vector<std::string>;

TEST_CASE("hostlists expand as scontrol show hostnames does") {
  auto [list, expected] = GENERATE(table<std::string, Hosts>({
      // BEGIN SCONTROL CASES
      {"n1", {"n1"}},
      {"a,b,c", {"a", "b", "c"}},
      {"node[01-04,07]", {"node01", "node02", "node03", "node04", "node07"}},
      {"linux[1,2]", {"linux1", "linux2"}},
      {"nodeA,nodeB[001,003]", {"nodeA", "nodeB001", "nodeB003"}},
      {"node[9-11]", {"node9", "node10", "node11"}},
      {"node[09-11]", {"node09", "node10", "node11"}},
      {"n[008-12]", {"n008", "n009", "n010", "n011", "n012"}},
      {"n[1-02]", {"n1", "n2"}},
      {"n[0001-0003]", {"n0001", "n0002", "n0003"}},
      {"node[001-003,5,010-011]", {"node001", "node002", "node003", "node5", "node010", "node011"}},
      {"n[3,1,2]", {"n3", "n1", "n2"}},
      {"n[1-2],n[2-3]", {"n1", "n2", "n2", "n3"}},
      {"h[0]", {"h0"}},
      {"[1-2]", {"1", "2"}},
      {"rack[1-2]-n[01-02]", {"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}},
      {"a[1-2]b[3-4]", {"a1b3", "a1b4", "a2b3", "a2b4"}},
      {"a-[01-02]-b-[1-2]", {"a-01-b-1", "a-01-b-2", "a-02-b-1", "a-02-b-2"}},
      {"r[1-2]n[1-2]s[1-2]",
       {"r1n1s1", "r1n1s2", "r2n1s1", "r2n1s2", "r1n2s1", "r1n2s2", "r2n2s1", "r2n2s2"}},
      {"gpu-a100-[1-3]", {"gpu-a100-1", "gpu-a100-2", "gpu-a100-3"}},
      {"my-node-x", {"my-node-x"}},
      {"my-node-x,c5-ib", {"my-node-x", "c5-ib"}},
      {"x[1-2],y", {"x1", "x2", "y"}},
      {"n[1-2],m[01-3]", {"n1", "n2", "m01", "m02", "m03"}},
      {"a,,b", {"a", "b"}},
      {",n1", {"n1"}},
      {"n1,", {"n1"}},
      {"a b", {"a", "b"}},
      {"a\tb", {"a", "b"}},
      {"n[1-2] m[3-4]", {"n1", "n2", "m3", "m4"}},
      // END SCONTROL CASES
  }));
  std::string error;
  auto hosts = expand_hostlist(list, error);
  INFO(list << ": " << error);
  REQUIRE(hosts);
  CHECK(*hosts == expected);
}

TEST_CASE("a thousand zero-padded hosts keep the width of the lower bound") {
  std::string error;
  auto hosts = expand_hostlist("n[001-1000]", error);  // scontrol: n001 ... n999 n1000
  REQUIRE(hosts);
  REQUIRE(hosts->size() == 1000);
  CHECK(hosts->front() == "n001");
  CHECK((*hosts)[98] == "n099");
  CHECK(hosts->back() == "n1000");
}

TEST_CASE("text after the last bracket is a suffix (Slurm 22.05 refuses it; it never produces it)") {
  auto [list, expected] = GENERATE(table<std::string, Hosts>({
      {"c[5-6]-ib", {"c5-ib", "c6-ib"}},
      {"my-node-x,c[5-6]-ib", {"my-node-x", "c5-ib", "c6-ib"}},
      {"[1-2]x", {"1x", "2x"}},
      {"a[1-2]b[3-4]c", {"a1b3c", "a1b4c", "a2b3c", "a2b4c"}},
  }));
  std::string error;
  auto hosts = expand_hostlist(list, error);
  INFO(list << ": " << error);
  REQUIRE(hosts);
  CHECK(*hosts == expected);
}

TEST_CASE("bad hostlists are refused with a reason") {
  auto [list, why] = GENERATE(table<std::string, std::string>({
      // scontrol refuses these too ("Invalid hostlist") or prints nothing
      {"", "empty"},
      {" ", "no host"},
      {",", "no host"},
      {"node[2-1]", "backwards"},
      {"node[a-b]", "bad range"},
      {"node[[1]]", "nested"},
      {"n[]", "bad range"},
      {"n[1,,2]", "bad range"},
      {"n[1-2-3]", "bad range"},
      {"n[-1]", "bad range"},
      {"n[0-99999999]", "too large"},
      {"n[1-1000][1-1000][1-1000]", "too many"},
      // scontrol guesses ("node]", "node1-2]", "node1", "n01 n02"); ddprun refuses
      {"node[1-2", "missing ']'"},
      {"node1-2]", "unbalanced ']'"},
      {"node[1-]", "bad range"},
      {"n[ 1-2]", "bad range"},
  }));
  std::string error;
  INFO(list);
  CHECK_FALSE(expand_hostlist(list, error));
  CHECK_THAT(error, Catch::Contains(why));
}

TEST_CASE("SLURM_TASKS_PER_NODE expands counts and repetitions") {
  std::string error;
  CHECK(*expand_tasks_per_node("2(x3),1", error) == std::vector<int>{2, 2, 2, 1});
  CHECK(*expand_tasks_per_node("1(x2)", error) == std::vector<int>{1, 1});  // as srun -N2 set it
  CHECK(*expand_tasks_per_node("4", error) == std::vector<int>{4});
  CHECK(*expand_tasks_per_node("1,2(x2)", error) == std::vector<int>{1, 2, 2});
  for (std::string bad : {"", "x", "2(x)", "2(x0)", "2(3)", "2(x3", "1,,2", "-1", "2(x-1)"}) {
    INFO(bad);
    CHECK_FALSE(expand_tasks_per_node(bad, error));
  }
}
