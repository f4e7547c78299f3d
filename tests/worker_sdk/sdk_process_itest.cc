// The worker SDK as real processes under the real launcher: sdk_allreduce_check run by
// `ddprun --standalone --nproc_per_node 3 --no_python`, over shared memory and over the TCP ring, and a
// rank that SIGKILLs itself mid-collective: the survivors report CollectiveError and ddprun fails.
#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "child_processes.h"

namespace {

using ddprun::testing::Child;

// Runs argv with extra environment entries to its end (its group is killed at the deadline).
Child run(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
          std::chrono::seconds limit) {
  std::vector<Child> one{ddprun::testing::spawn_child(argv, extra_env)};
  ddprun::testing::wait_children(one, limit);
  return one.front();
}

std::vector<std::string> ddprun_argv(const std::vector<std::string>& worker_args) {
  std::vector<std::string> a = {DDPRUN_PATH, "--standalone", "--nproc_per_node",
                                "3",         "--no_python",  SDK_CHECK_PATH};
  a.insert(a.end(), worker_args.begin(), worker_args.end());
  return a;
}

}  // namespace

// (The shared-memory run is the plain CTest command sdk.allreduce_check.ddprun3.)
TEST_CASE("sdk_allreduce_check passes under ddprun with 3 ranks over the TCP ring", "[sdk_process]") {
  const std::string transport = "tcp";
  CAPTURE(transport);
  Child r = run(ddprun_argv({"--iterations", "1"}), {"DDPRUN_CPU_TRANSPORT=" + transport},
                std::chrono::seconds(240));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK_THAT(r.output, Catch::Contains("rank " + std::to_string(rank) + ": all checks passed"));
  }
  CHECK_THAT(r.output, Catch::Contains(transport == "tcp" ? "cpu: tcp-ring(3)" : "cpu: shm(3)"));
}

TEST_CASE("a rank killed mid-collective: the others report CollectiveError, ddprun fails", "[sdk_process]") {
  const std::string transport = GENERATE("auto", "tcp");
  CAPTURE(transport);
  Child r = run(ddprun_argv({"--kill-rank", "1", "--timeout-ms", "60000"}),
                {"DDPRUN_CPU_TRANSPORT=" + transport}, std::chrono::seconds(240));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  std::regex line(R"(rank (\d): CollectiveError peer=(-?\d+) after ([0-9.]+) s)");
  int reports = 0, naming_rank1 = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line); it != std::sregex_iterator();
       ++it) {
    CHECK((*it)[1] != "1");
    ++reports;
    if ((*it)[2] == "1") ++naming_rank1;
  }
  CHECK(reports == 2);  // both survivors
  // Over shared memory both see rank 1's pid gone; in the ring at least its neighbour names it.
  CHECK(naming_rank1 >= (transport == "auto" ? 2 : 1));
}
