// Unit tests of launcher/preflight.h: the program and the script are checked before the rendezvous. Real
// files in a temporary directory; no processes.
#include "launcher/preflight.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "launcher/launch_config.h"

namespace {

namespace fs = std::filesystem;
using namespace ddprun::launcher;

struct TempDir {
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddprun-preflight-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path file(const std::string& name, const std::string& text, fs::perms perms) const {
    std::ofstream(path / name) << text;
    fs::permissions(path / name, perms);
    return path / name;
  }
  fs::path path;
};

LaunchConfig parse(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  LaunchConfig c;
  auto r = parse_launch_config(argv, {}, [] { return 0; }, c);
  INFO(r.message);
  REQUIRE_FALSE(r.should_exit);
  return c;
}

constexpr auto kExec = fs::perms::owner_all;
constexpr auto kRead = fs::perms::owner_read | fs::perms::owner_write;

}  // namespace

TEST_CASE("preflight: an interpreter in PATH and a readable script pass") {
  TempDir dir;
  dir.file("py", "#!/bin/sh\n", kExec);
  dir.file("train.py", "print(1)\n", kRead);
  const std::map<std::string, std::string> env{{"PATH", "/nonexistent:" + dir.path.string()}};
  CHECK(preflight(parse({"--python", "py", "train.py"}), env, dir.path).empty());
  CHECK(preflight(parse({"--python", "py", (dir.path / "train.py").string()}), env, "/").empty());
  // A module is Python's to find; ${local_rank} in the script name is resolved for local rank 0.
  CHECK(preflight(parse({"--python", "py", "-m", "no.such.module"}), env, dir.path).empty());
  dir.file("train_0.py", "", kRead);
  CHECK(preflight(parse({"--python", "py", "train_${local_rank}.py"}), env, dir.path).empty());
}

TEST_CASE("preflight: a missing script is named with the directory it was looked for in") {
  TempDir dir;
  const std::map<std::string, std::string> env{{"PATH", "/usr/bin:/bin"}};
  auto errors = preflight(parse({"--python", "/bin/sh", "tran.py"}), env, dir.path);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Catch::StartsWith("ddprun: cannot read the training script 'tran.py'") &&
                            Catch::Contains(dir.path.string()) && Catch::Contains("No such file") &&
                            Catch::Contains("-m for a module"));
}

TEST_CASE("preflight: an interpreter that is not there, or not executable, is named with what to do") {
  TempDir dir;
  dir.file("train.py", "", kRead);
  const auto not_exec = dir.file("python-not-exec", "", kRead);
  const std::map<std::string, std::string> env{{"PATH", dir.path.string()}};
  auto missing = preflight(parse({"--python", "python3.99", "train.py"}), env, dir.path);
  REQUIRE(missing.size() == 1);
  CHECK_THAT(missing[0], Catch::Contains("--python") && Catch::Contains("'python3.99' not found in PATH=") &&
                             Catch::Contains("DDPRUN_PYTHON"));
  auto denied = preflight(parse({"--python", not_exec.string(), "train.py"}), env, dir.path);
  REQUIRE(denied.size() == 1);
  CHECK_THAT(denied[0], Catch::Contains(not_exec.string()) && Catch::Contains("ermission denied"));
  // Both wrong: both reported.
  CHECK(preflight(parse({"--python", "python3.99", "tran.py"}), env, dir.path).size() == 2);
}

TEST_CASE("preflight: with --no_python the script is the program, looked up like exec does") {
  TempDir dir;
  dir.file("worker", "#!/bin/sh\n", kExec);
  dir.file("data.txt", "", kRead);
  const std::map<std::string, std::string> env{{"PATH", dir.path.string()}};
  CHECK(preflight(parse({"--no_python", "worker", "--flag"}), env, "/").empty());
  auto errors = preflight(parse({"--no_python", (dir.path / "data.txt").string()}), env, "/");
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Catch::Contains("the training program") && Catch::Contains("--no_python"));
}
