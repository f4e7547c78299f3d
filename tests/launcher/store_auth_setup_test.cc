// How --rdzv_auth and --rdzv_secret_file choose the store's authentication (launcher/store_auth_setup.h),
// without munged: a socket nothing listens on stands for a node whose munged is down. (MUNGE with a running
// munged: tests/rendezvous/auth/munge_auth_itest.cc; the mismatch between nodes with real agents:
// store_auth_mismatch_itest.cc; under Slurm: tests/integration/test_slurm.py.)
#include "launcher/store_auth_setup.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "rendezvous/auth/munge_auth.h"

using namespace ddprun::launcher;
namespace fs = std::filesystem;

namespace {

const std::map<std::string, std::string> kSlurmEnv{{"SLURM_JOB_ID", "77"},
                                                   {"DDPRUN_MUNGE_SOCKET", "/nonexistent/munge.socket"}};

}  // namespace

TEST_CASE("store auth setup: the modes", "[launcher][auth]") {
  CHECK(parse_auth_mode("auto") == AuthMode::kAuto);
  CHECK(parse_auth_mode("munge") == AuthMode::kMunge);
  CHECK(parse_auth_mode("none") == AuthMode::kNone);
  CHECK_FALSE(parse_auth_mode("MUNGE"));
}

TEST_CASE("store auth setup: outside Slurm, auto is open; none is open under Slurm", "[launcher][auth]") {
  auto open =
      setup_store_auth(AuthMode::kAuto, {}, "job", {{"DDPRUN_MUNGE_SOCKET", "/nonexistent/munge"}}, 1);
  CHECK_FALSE(open.auth);
  CHECK(open.warning.empty());
  auto none = setup_store_auth(AuthMode::kNone, {}, "job", kSlurmEnv, 1);
  CHECK_FALSE(none.auth);
  CHECK(none.warning.empty());
}

TEST_CASE("store auth setup: under Slurm is inside a Slurm job's allocation, in Slurm mode or not",
          "[launcher][auth]") {
  // SLURM_JOB_ID alone (an salloc shell, --no_slurm, explicit flags): MUNGE is tried, as the docs say.
  auto setup = setup_store_auth(AuthMode::kAuto, {}, "job", kSlurmEnv, 1);
  REQUIRE(setup.auth);
  CHECK_THAT(setup.warning, Catch::Contains("under Slurm"));
}

TEST_CASE("store auth setup: under Slurm with munged down, auto follows the store's host; munge fails",
          "[launcher][auth]") {
  auto setup = setup_store_auth(AuthMode::kAuto, {}, "job", kSlurmEnv, 1);
  CHECK_THAT(setup.warning, Catch::Contains("/nonexistent/munge.socket") &&
                                Catch::Contains("stores this node hosts are open") &&
                                Catch::Contains("follows the job's store"));
  // Not a per-node decision to run open and connect without a credential: the stores this node hosts are
  // open, and it joins whatever the store's host decided, checking munged again if that is MUNGE.
  REQUIRE(setup.auth);
  CHECK_FALSE(setup.auth->store_requires());
  CHECK(setup.auth->joins_open_store());
  const auto* munge = dynamic_cast<const ddprun::rdzv::MungeAuth*>(setup.auth.get());
  REQUIRE(munge);
  CHECK(munge->use() == ddprun::rdzv::MungeAuth::Use::kFollowUnchecked);
  CHECK_THROWS_WITH(setup_store_auth(AuthMode::kMunge, {}, "job", kSlurmEnv, 1),
                    Catch::Contains("--rdzv_auth munge") && Catch::Contains("/nonexistent/munge.socket"));
}

TEST_CASE("store auth setup: the secret file wins under auto and contradicts munge and none",
          "[launcher][auth]") {
  const fs::path file = fs::temp_directory_path() / ("ddprun-secret-" + std::to_string(::getpid()));
  std::ofstream(file) << "0123456789abcdef0123\n";
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
  auto setup = setup_store_auth(AuthMode::kAuto, file, "job", kSlurmEnv, 1);
  REQUIRE(setup.auth);
  CHECK_THAT(setup.auth->what(), Catch::Contains("--rdzv_secret_file"));
  CHECK_FALSE(setup.auth->joins_open_store());  // a job with a secret is never half protected
  CHECK_THROWS_WITH(setup_store_auth(AuthMode::kMunge, file, "job", kSlurmEnv, 1),
                    Catch::Contains("contradict"));
  CHECK_THROWS_WITH(setup_store_auth(AuthMode::kNone, file, "job", {}, 1), Catch::Contains("contradict"));
  // A secret file that others may read ends the start (it was a warning before).
  ::chmod(file.c_str(), 0644);
  CHECK_THROWS_WITH(setup_store_auth(AuthMode::kAuto, file, "job", {}, 1), Catch::Contains("chmod 600"));
  fs::remove(file);
}
