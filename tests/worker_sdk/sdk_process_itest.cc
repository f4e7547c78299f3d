// The worker SDK as real processes under the real launcher: sdk_allreduce_check run by
// `ddprun --standalone --nproc_per_node 3 --no_python`, over shared memory and over the TCP ring, and a
// rank that SIGKILLs itself mid-collective: the survivors report CollectiveError and ddprun fails.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <regex>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Result {
  int exit_code = -1;  // 128+N for a signal
  std::string output;  // stdout and stderr interleaved
};

// Runs argv with extra environment entries, in its own process group; kills the group at the deadline.
Result run(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
           std::chrono::seconds limit) {
  int pipefd[2];
  REQUIRE(::pipe2(pipefd, O_CLOEXEC) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  for (const auto& e : extra_env) env.push_back(e);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, cargv[0], &fa, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(pipefd[1]);
  REQUIRE(rc == 0);

  Result res;
  auto deadline = std::chrono::steady_clock::now() + limit;
  bool killed = false;
  for (;;) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
            .count());
    if (left <= 0 && !killed) {
      ::kill(-pid, SIGKILL);
      killed = true;
      res.output += "\n[test: killed after " + std::to_string(limit.count()) + " s]\n";
    }
    pollfd p{pipefd[0], POLLIN, 0};
    ::poll(&p, 1, killed ? 1000 : std::min(left, 1000));
    char buf[4096];
    ssize_t k = ::read(pipefd[0], buf, sizeof buf);
    if (k > 0) {
      res.output.append(buf, static_cast<size_t>(k));
      continue;
    }
    if (k == 0) break;  // every writer is gone
    if (errno != EAGAIN && errno != EINTR && errno != EWOULDBLOCK) break;
  }
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::kill(-pid, SIGKILL);  // nothing of the group may outlive the test
  res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return res;
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
  Result r = run(ddprun_argv({"--iterations", "1"}), {"DDPRUN_CPU_TRANSPORT=" + transport},
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
  Result r = run(ddprun_argv({"--kill-rank", "1", "--timeout-ms", "60000"}),
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
