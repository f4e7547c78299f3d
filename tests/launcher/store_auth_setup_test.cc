// How --rdzv_auth and --rdzv_secret_file choose the store's authentication (launcher/store_auth_setup.h),
// without munged: a socket nothing listens on stands for a node whose munged is down. (MUNGE with a running
// munged: tests/rendezvous/auth/munge_auth_itest.cc; under Slurm: tests/integration/test_slurm.py.)
#include "launcher/store_auth_setup.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

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
  auto open = setup_store_auth(AuthMode::kAuto, {}, false, "job", {});
  CHECK_FALSE(open.auth);
  CHECK(open.warning.empty());
  auto none = setup_store_auth(AuthMode::kNone, {}, true, "job", kSlurmEnv);
  CHECK_FALSE(none.auth);
  CHECK(none.warning.empty());
}

TEST_CASE("store auth setup: under Slurm with munged down, auto warns and munge fails", "[launcher][auth]") {
  auto setup = setup_store_auth(AuthMode::kAuto, {}, true, "job", kSlurmEnv);
  CHECK_FALSE(setup.auth);
  CHECK_THAT(setup.warning,
             Catch::Contains("/nonexistent/munge.socket") && Catch::Contains("open to anyone"));
  CHECK_THROWS_WITH(setup_store_auth(AuthMode::kMunge, {}, true, "job", kSlurmEnv),
                    Catch::Contains("--rdzv_auth munge") && Catch::Contains("/nonexistent/munge.socket"));
}

TEST_CASE("store auth setup: the secret file wins under auto and contradicts munge and none",
          "[launcher][auth]") {
  const fs::path file = fs::temp_directory_path() / ("ddprun-secret-" + std::to_string(::getpid()));
  std::ofstream(file) << "0123456789abcdef0123\n";
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
  auto setup = setup_store_auth(AuthMode::kAuto, file, true, "job", kSlurmEnv);
  REQUIRE(setup.auth);
  CHECK_THAT(setup.auth->what(), Catch::Contains("--rdzv_secret_file"));
  CHECK_THROWS_WITH(setup_store_auth(AuthMode::kMunge, file, true, "job", kSlurmEnv),
                    Catch::Contains("contradict"));
  CHECK_THROWS_WITH(setup_store_auth(AuthMode::kNone, file, false, "job", {}), Catch::Contains("contradict"));
  fs::remove(file);
}
