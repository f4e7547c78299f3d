// Unit tests of the pure parts of the orphan guard: /proc/<pid>/stat lines and ppid trees
// (agent/process/process_tree.h), /proc/self/cgroup and mountinfo to the workers' cgroup directory
// (agent/process/worker_cgroup.h).
#include "agent/process/process_tree.h"

#include <string>
#include <vector>

#include "agent/process/worker_cgroup.h"
#include "catch_compat.h"

using namespace ddprun::agent;

TEST_CASE("a /proc/<pid>/stat line gives pid, state, ppid, process group and session") {
  const auto s = parse_proc_stat("4242 (python3) S 4200 4242 4100 0 -1 4194560 1 0 0 0\n");
  REQUIRE(s.has_value());
  CHECK(*s == ProcStat{4242, 'S', 4200, 4242, 4100});
}

TEST_CASE("a command name with spaces and parentheses does not shift the fields") {
  const auto s = parse_proc_stat("17 (a b) (c)) Z 1 17 17 0 -1");
  REQUIRE(s.has_value());
  CHECK(*s == ProcStat{17, 'Z', 1, 17, 17});
}

TEST_CASE("malformed /proc/<pid>/stat text is refused") {
  CHECK_FALSE(parse_proc_stat("").has_value());
  CHECK_FALSE(parse_proc_stat("12 (x) S 1 2").has_value());
  CHECK_FALSE(parse_proc_stat("12 x S 1 2 3").has_value());
  CHECK_FALSE(parse_proc_stat("x2 (x) S 1 2 3").has_value());
  CHECK_FALSE(parse_proc_stat("12 (x) S one 2 3").has_value());
}

TEST_CASE("descendants follow ppid chains from the root, without the root and the skipped subtree") {
  // 100 (agent) -> 101 (guard) -> 106; 100 -> 102 (worker) -> 103 -> 104; 100 -> 105 (adopted orphan);
  // 1 -> 200 (unrelated) -> 201.
  const std::vector<ProcStat> table = {{1, 'S', 0, 1, 1},         {100, 'S', 1, 100, 100},
                                       {101, 'S', 100, 101, 100}, {102, 'S', 100, 102, 100},
                                       {103, 'S', 102, 102, 100}, {104, 'Z', 103, 104, 104},
                                       {105, 'S', 100, 105, 105}, {106, 'S', 101, 101, 100},
                                       {200, 'S', 1, 200, 200},   {201, 'S', 200, 200, 200}};
  CHECK(descendants(table, 100) == std::vector<pid_t>{101, 102, 103, 104, 105, 106});
  CHECK(descendants(table, 100, 101) == std::vector<pid_t>{102, 103, 104, 105});
  CHECK(descendants(table, 102) == std::vector<pid_t>{103, 104});
  CHECK(descendants(table, 999).empty());
}

TEST_CASE("a ppid cycle in a torn table ends the walk") {
  const std::vector<ProcStat> table = {{5, 'S', 6, 5, 5}, {6, 'S', 5, 6, 6}, {7, 'S', 1, 7, 7}};
  CHECK(descendants(table, 1) == std::vector<pid_t>{7});
}

TEST_CASE("the cgroup v2 path is the 0:: line of /proc/self/cgroup") {
  CHECK(cgroup2_path("0::/user.slice/user-1000.slice/session-3.scope\n") ==
        "/user.slice/user-1000.slice/session-3.scope");
  // Hybrid host: v1 hierarchies first, the unified one last.
  CHECK(cgroup2_path("9:name=systemd:/\n4:memory:/job\n0::/\n") == "/");
  CHECK_FALSE(cgroup2_path("4:memory:/job\n1:cpu:/\n").has_value());
}

TEST_CASE("the cgroup directory is found under the cgroup2 mount, unified or hybrid") {
  const std::string unified =
      "25 1 0:22 / /sys rw - sysfs sysfs rw\n"
      "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
  CHECK(cgroup2_directory(unified, "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0") ==
        "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0/user/task_0");
  CHECK(cgroup2_directory(unified, "/") == "/sys/fs/cgroup");
  const std::string hybrid =
      "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  CHECK(cgroup2_directory(hybrid, "/") == "/sys/fs/cgroup/unified");
  CHECK(cgroup2_directory(hybrid, "/a b") == "/sys/fs/cgroup/unified/a b");
}

TEST_CASE("a cgroup2 mount of a subtree maps only paths inside it, and mount point escapes are decoded") {
  const std::string info =
      "41 30 0:37 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n"
      "42 30 0:37 / /mnt/all\\040cgroups rw - cgroup2 cgroup2 rw\n";
  CHECK(cgroup2_directory(info, "/docker/abc/x") == "/sys/fs/cgroup/x");
  CHECK(cgroup2_directory(info, "/docker/abcd") == "/mnt/all cgroups/docker/abcd");
  CHECK_FALSE(cgroup2_directory("30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n", "/").has_value());
}
