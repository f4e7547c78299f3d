// LogLayout against a temporary directory.
#include "agent/log_layout.h"

#include <stdlib.h>

#include <fstream>
#include <regex>

#include "catch_compat.h"

namespace fs = std::filesystem;
using ddprun::agent::LogLayout;

TEST_CASE("LogLayout builds torchrun's log directory tree", "[log_layout]") {
  char name[] = "/tmp/ddprun-log-test-XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  const fs::path root = name;
  const fs::path log_dir = root / "logs" / "nested";

  const LogLayout a = LogLayout::create(log_dir, "job7");
  const LogLayout b = LogLayout::create(log_dir, "job7");
  CHECK(a.run_dir().parent_path() == log_dir);
  CHECK(std::regex_match(a.run_dir().filename().string(), std::regex("job7_[a-z0-9_]{8}")));
  CHECK(a.run_dir() != b.run_dir());
  CHECK(fs::is_directory(a.run_dir()));

  const auto paths = a.create_attempt(0, 3);
  REQUIRE(paths.size() == 3);
  for (int r = 0; r < 3; ++r) {
    const fs::path dir = a.run_dir() / "attempt_0" / std::to_string(r);
    CHECK(paths[r].local_rank == r);
    CHECK(paths[r].dir == dir);
    CHECK(fs::is_directory(dir));
    CHECK(paths[r].stdout_file == dir / "stdout.log");
    CHECK(paths[r].stderr_file == dir / "stderr.log");
    CHECK(paths[r].error_file == dir / "error.json");
  }
  CHECK(a.worker(2, 1).error_file == a.run_dir() / "attempt_2" / "1" / "error.json");
  CHECK_FALSE(fs::exists(a.run_dir() / "attempt_2"));  // worker() is pure

  // A repeated attempt starts from an empty directory, as torch's rmtree + makedirs.
  std::ofstream(paths[0].stdout_file) << "old";
  const auto again = a.create_attempt(0, 1);
  CHECK_FALSE(fs::exists(paths[0].stdout_file));
  CHECK_FALSE(fs::exists(paths[2].dir));
  CHECK(fs::is_directory(again[0].dir));

  fs::remove_all(root);
}

TEST_CASE("LogLayout::create reports an unusable log_dir", "[log_layout]") {
  char name[] = "/tmp/ddprun-log-test-XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  const fs::path file = fs::path(name) / "a-file";
  std::ofstream(file) << "x";
  CHECK_THROWS_AS(LogLayout::create(file / "logs", "r"), fs::filesystem_error);
  fs::remove_all(name);
}
