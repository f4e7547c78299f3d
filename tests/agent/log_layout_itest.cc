// LogLayout against a temporary directory, and the log files a worker launch asks for.
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "agent/log_layout.h"
#include "agent/worker_launches.h"
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

TEST_CASE("LogLayout::create makes a relative log_dir absolute", "[log_layout]") {
  char name[] = "/tmp/ddprun-log-test-XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  const fs::path before = fs::current_path();
  fs::current_path(name);
  const LogLayout layout = LogLayout::create("logs/./x/../y", "r");
  fs::current_path(before);
  CHECK(layout.run_dir().parent_path() == fs::path(name) / "logs" / "y");
  CHECK(fs::is_directory(layout.run_dir()));
  CHECK(layout.worker(0, 0).error_file.is_absolute());
  fs::remove_all(name);
}

TEST_CASE("LogLayout::create reports an unusable log_dir", "[log_layout]") {
  char name[] = "/tmp/ddprun-log-test-XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  const fs::path file = fs::path(name) / "a-file";
  std::ofstream(file) << "x";
  CHECK_THROWS_AS(LogLayout::create(file / "logs", "r"), fs::filesystem_error);
  fs::remove_all(name);
}

// Which files torchrun 2.6 writes under attempt_<n>/<local_rank>/ (tests/integration/test_pytorch_errors.py
// compares whole trees with torchrun's own): the directories, stdout.log / stderr.log only for the streams
// -r/-t send to a file, error.json only when the worker's @record writes it. ddprun adds stderr.log only with
// hang detection or the FileTimer (stack dumps are read from it).
TEST_CASE("LogLayout: an attempt holds directories only; a worker gets the files its streams ask for",
          "[log_layout]") {
  char name[] = "/tmp/ddprun-log-test-XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  const LogLayout layout = LogLayout::create(fs::path(name) / "logs", "job");
  const auto paths = layout.create_attempt(0, 4);
  std::vector<std::string> tree;
  for (const auto& e : fs::recursive_directory_iterator(layout.run_dir())) {
    tree.push_back(fs::relative(e.path(), layout.run_dir()).string() + (e.is_directory() ? "/" : ""));
  }
  std::sort(tree.begin(), tree.end());
  CHECK(tree == std::vector<std::string>{"attempt_0/", "attempt_0/0/", "attempt_0/1/", "attempt_0/2/",
                                         "attempt_0/3/"});

  using namespace ddprun::agent;
  AgentConfig c;
  c.workers.resize(4);
  for (auto& w : c.workers) w.argv = {"python3", "-u", "t.py"};
  c.workers[1].output.stdout_to_file = true;                               // -r 1:1 (or -t)
  c.workers[2].output.stderr_to_file = true;                               // -r 2:2
  c.workers[3].output = {.stdout_to_file = true, .stderr_to_file = true};  // -r 3:3
  ddprun::rdzv::RendezvousInfo info;
  info.world_size = 4;
  auto launches = worker_launches(c, info, paths, "job");
  auto files = [&](const WorkerLaunch& w) {
    return std::make_pair(w.stdout_file.empty() ? "" : w.stdout_file.filename().string(),
                          w.stderr_file.empty() ? "" : w.stderr_file.filename().string());
  };
  CHECK(files(launches[0]) == std::make_pair(std::string(), std::string()));
  CHECK(files(launches[1]) == std::make_pair(std::string("stdout.log"), std::string()));
  CHECK(files(launches[2]) == std::make_pair(std::string(), std::string("stderr.log")));
  CHECK(files(launches[3]) == std::make_pair(std::string("stdout.log"), std::string("stderr.log")));
  for (const auto& w : launches)
    CHECK(w.env.at("TORCHELASTIC_ERROR_FILE") == paths[w.local_rank].error_file.string());

  c.supervision.hang_timeout =
      std::chrono::seconds(60);  // ddprun's hang detection reads every rank's stderr.log
  launches = worker_launches(c, info, paths, "job");
  for (const auto& w : launches) CHECK(w.stderr_file == paths[w.local_rank].stderr_file);
  fs::remove_all(name);
}
