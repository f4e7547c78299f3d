// Unit tests of launcher/preflight.h and launcher/interpreter_check.h: the program, the script, the store's
// port and whether the interpreter runs are checked before the rendezvous. Real files in a temporary
// directory; the "interpreters" are small shell scripts (and /usr/bin/python3), the busy port a socket of the
// test's own on a port the kernel picked.
#include "launcher/preflight.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "launcher/interpreter_check.h"
#include "launcher/launch_config.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using namespace ddprun::launcher;

using ddprun::testing::TempDir;

LaunchConfig parse(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  LaunchConfig c;
  auto r = parse_launch_config(
      argv, {}, [] { return 0; }, c);
  INFO(r.message);
  REQUIRE_FALSE(r.should_exit);
  return c;
}

constexpr auto kExec = fs::perms::owner_all;
constexpr auto kRead = fs::perms::owner_read | fs::perms::owner_write;

}  // namespace

TEST_CASE("preflight: an interpreter in PATH and a readable script pass") {
  TempDir dir;
  dir.write("py", "#!/bin/sh\n", kExec);
  dir.write("train.py", "print(1)\n", kRead);
  const std::map<std::string, std::string> env{{"PATH", "/nonexistent:" + dir.path.string()}};
  CHECK(preflight(parse({"--python", "py", "train.py"}), env, dir.path).empty());
  CHECK(preflight(parse({"--python", "py", (dir.path / "train.py").string()}), env, "/").empty());
  // A module is Python's to find; ${local_rank} in the script name is resolved for local rank 0.
  CHECK(preflight(parse({"--python", "py", "-m", "no.such.module"}), env, dir.path).empty());
  dir.write("train_0.py", "", kRead);
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

TEST_CASE("preflight: --log_dir is created, and one that cannot be is named with what to do") {
  TempDir dir;
  dir.write("py", "#!/bin/sh\n", kExec);
  dir.write("train.py", "", kRead);
  const std::map<std::string, std::string> env{{"PATH", dir.path.string()}};
  // Created as the agent would create it, relative to the working directory.
  CHECK(preflight(parse({"--python", "py", "--log_dir", "logs/a/b", "train.py"}), env, dir.path).empty());
  CHECK(fs::is_directory(dir.path / "logs/a/b"));
  // Under a regular file: fails for root too (the suite runs as root, which permissions do not stop).
  dir.write("plain", "", kRead);
  auto errors = preflight(parse({"--python", "py", "--log_dir", "plain/logs", "train.py"}), env, dir.path);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0],
             Catch::StartsWith("ddprun: --log_dir 'plain/logs' (" + (dir.path / "plain/logs").string() +
                               "): cannot create it or write in it: ") &&
                 Catch::Contains("leave --log_dir out"));
  if (::geteuid() != 0) {
    fs::create_directory(dir.path / "ro");
    fs::permissions(dir.path / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    auto denied = preflight(parse({"--python", "py", "--log_dir", (dir.path / "ro").string(), "train.py"}),
                            env, dir.path);
    REQUIRE(denied.size() == 1);
    CHECK_THAT(denied[0], Catch::Contains("ermission denied"));
  }
}

TEST_CASE("preflight: an interpreter that is not there, or not executable, is named with what to do") {
  TempDir dir;
  dir.write("train.py", "", kRead);
  const auto not_exec = dir.write("python-not-exec", "", kRead);
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
  dir.write("worker", "#!/bin/sh\n", kExec);
  dir.write("data.txt", "", kRead);
  const std::map<std::string, std::string> env{{"PATH", dir.path.string()}};
  CHECK(preflight(parse({"--no_python", "worker", "--flag"}), env, "/").empty());
  auto errors = preflight(parse({"--no_python", (dir.path / "data.txt").string()}), env, "/");
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Catch::Contains("the training program") && Catch::Contains("--no_python"));
}

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A listening IPv4 socket on a port the kernel picked (0.0.0.0), closed at the end of the test.
struct BusyPort {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  uint16_t port = 0;
  BusyPort() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~BusyPort() { ::close(fd); }
};

}  // namespace

TEST_CASE("preflight: an interpreter that does not run is one line naming it, how it ended and why") {
  TempDir dir;
  dir.write("train.py", "", kRead);
  const std::map<std::string, std::string> env{{"PATH", dir.path.string() + ":/usr/bin:/bin"}};
  auto problem_of = [&](const std::string& body) {
    dir.write("py", "#!/bin/sh\n" + body, kExec);
    auto errors = preflight(parse({"--python", "py", "train.py"}), env, dir.path);
    REQUIRE(errors.size() == 1);
    INFO(errors[0]);
    CHECK(errors[0].find('\n') == std::string::npos);
    CHECK_THAT(errors[0],
               Catch::StartsWith("ddprun: the interpreter 'py' (" + (dir.path / "py").string() + ")") &&
                   Catch::Contains("--python PATH (or DDPRUN_PYTHON)"));
    return errors[0];
  };
  SECTION("Python's own fatal error: its 'Fatal Python error' line") {
    CHECK_THAT(
        problem_of("echo 'Python path configuration:' >&2\n"
                   "echo \"  PYTHONHOME = '/nowhere'\" >&2\n"
                   "echo 'Fatal Python error: init_fs_encoding: failed to get the Python codec' >&2\n"
                   "echo \"ModuleNotFoundError: No module named 'encodings'\" >&2\nexit 1\n"),
        Catch::Contains("does not run: `py -S -c ''` exited with 1: Fatal Python error: init_fs_encoding: "
                        "failed to get the Python codec;"));
  }
  SECTION("a wrapper's message: its last line") {
    CHECK_THAT(
        problem_of("echo \"pyenv: version \\`3.9' is not installed (set by PYENV_VERSION)\" >&2\nexit 127\n"),
        Catch::Contains("exited with 127: pyenv: version `3.9' is not installed (set by PYENV_VERSION);"));
  }
  SECTION("killed by a signal, silent") {
    CHECK_THAT(problem_of("kill -SEGV $$\n"), Catch::Contains("`py -S -c ''` was killed by SIGSEGV; fix it"));
  }
  SECTION("not a program at all") {
    dir.write("py",
              std::string("\x7f"
                          "ELF\x01\x01 not really",
                          15),
              kExec);
    auto errors = preflight(parse({"--python", "py", "train.py"}), env, dir.path);
    REQUIRE(errors.size() == 1);
    CHECK_THAT(errors[0], Catch::Contains("cannot be executed: Exec format error"));
  }
}

TEST_CASE("interpreter check: the arguments, the environment, a descendant holding stderr, the deadline") {
  TempDir dir;
  const fs::path args = dir.path / "args";
  const auto py = dir.write("py",
                            "#!/bin/sh\nfor a in \"$@\"; do echo \"[$a]\"; done > " + args.string() +
                                "\n[ \"$MARK\" = yes ] || exit 3\nsleep 3 &\nexit 0\n",
                            kExec);
  InterpreterCheck check{.exe = py.string(),
                         .shown = "py",
                         .env = {{"MARK", "yes"}, {"PATH", "/usr/bin:/bin"}},
                         .cwd = dir.path.string(),
                         .use_cache = false};
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(interpreter_problem(check));
  // Its exit decides, not the end of stderr (the background sleep holds it for 3 s).
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2500));
  CHECK(read_file(args) == "[-S]\n[-c]\n[]\n");
  check.env.erase("MARK");
  CHECK_THAT(interpreter_problem(check).value_or(""), Catch::Contains("exited with 3"));

  // A slow start is not a broken interpreter: past the deadline it is killed and the launch goes on.
  const auto slow = dir.write("slow", "#!/bin/sh\nexec sleep 30\n", kExec);
  InterpreterCheck late{.exe = slow.string(),
                        .shown = "slow",
                        .env = {{"PATH", "/usr/bin:/bin"}},
                        .cwd = dir.path.string(),
                        .deadline = std::chrono::milliseconds(300),
                        .use_cache = false};
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(interpreter_problem(late));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("interpreter check: a success is remembered for the same file, path, directory and environment") {
  TempDir dir;
  const fs::path runs = dir.path / "runs";
  const auto py =
      dir.write("py", "#!/bin/sh\necho run >> " + runs.string() + "\nexit ${PYTHON_TEST_EXIT:-0}\n", kExec);
  InterpreterCheck check{
      .exe = py.string(),
      .shown = "py",
      .env = {{"PATH", "/usr/bin:/bin"}, {"XDG_CACHE_HOME", (dir.path / "cache").string()}},
      .cwd = dir.path.string()};
  auto count = [&] {
    const std::string text = read_file(runs);
    return std::count(text.begin(), text.end(), '\n');
  };
  CHECK_FALSE(interpreter_problem(check));
  CHECK(count() == 1);
  CHECK(fs::exists(dir.path / "cache" / "ddprun" / "interpreters-ok"));
  CHECK_FALSE(interpreter_problem(check));
  CHECK(count() == 1);              // remembered: not run again
  check.env["SLURM_JOB_ID"] = "7";  // not something a Python start depends on
  CHECK_FALSE(interpreter_problem(check));
  CHECK(count() == 1);

  check.env["PYTHONHOME"] = "/elsewhere";  // what steers Python: checked again
  CHECK_FALSE(interpreter_problem(check));
  CHECK(count() == 2);
  check.cwd = "/";  // pyenv's .python-version is looked up from here
  CHECK_FALSE(interpreter_problem(check));
  CHECK(count() == 3);
  fs::last_write_time(py, fs::last_write_time(py) - std::chrono::hours(1));  // another interpreter file
  CHECK_FALSE(interpreter_problem(check));
  CHECK(count() == 4);
  CHECK_FALSE(interpreter_problem(check));
  CHECK(count() == 4);

  // A failure is never remembered: the next launch checks again.
  check.env["PYTHON_TEST_EXIT"] = "1";
  CHECK(interpreter_problem(check));
  CHECK(interpreter_problem(check));
  CHECK(count() == 6);
  // An unusable cache directory only costs the run.
  check.env.erase("PYTHON_TEST_EXIT");
  check.env["XDG_CACHE_HOME"] = (dir.path / "runs").string();  // a file, not a directory
  CHECK_FALSE(interpreter_problem(check));
  CHECK_FALSE(interpreter_problem(check));
  CHECK(count() == 8);
}

TEST_CASE("interpreter check: the real python3, and the same with a PYTHONHOME that breaks it") {
  if (::access("/usr/bin/python3", X_OK) != 0) {
    WARN("no /usr/bin/python3 here");
    return;
  }
  InterpreterCheck check{.exe = "/usr/bin/python3",
                         .shown = "python3",
                         .env = {{"PATH", "/usr/bin:/bin"}},
                         .cwd = "/",
                         .use_cache = false};
  CHECK_FALSE(interpreter_problem(check));
  check.env["PYTHONHOME"] = "/nonexistent-python-home";
  const std::string problem = interpreter_problem(check).value_or("");
  INFO(problem);
  CHECK_THAT(problem, Catch::StartsWith("ddprun: the interpreter 'python3' (/usr/bin/python3) does not run: "
                                        "`python3 -S -c ''` exited with 1: Fatal Python error:"));
}

TEST_CASE("store_port_free: only a store this node hosts on a fixed port is probed, as the store binds") {
  BusyPort busy;
  const std::string port = std::to_string(busy.port);
  CHECK_FALSE(store_port_free(parse({"--nnodes", "2", "--node_rank", "0", "--master_port", port, "t.py"})));
  CHECK(store_port_free(parse({"--nnodes", "2", "--node_rank", "1", "--master_port", port, "t.py"})));
  CHECK(store_port_free(parse({"--standalone", "t.py"})));
  const std::vector<std::string> c10d{"--nnodes",         "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                                      "127.0.0.1:" + port};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = c10d;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  // c10d without is_host=1: a taken port means another agent of this host holds the store; it is joined.
  CHECK(store_port_free(parse(with({"t.py"}))));
  CHECK_FALSE(store_port_free(parse(with({"--rdzv_conf", "is_host=1", "t.py"}))));
  // A free port stays free after the probe (nothing lingers).
  BusyPort other;
  const std::string free_port = std::to_string(other.port);
  ::close(other.fd);
  other.fd = -1;
  CHECK(store_port_free(parse({"--nnodes", "1", "--master_port", free_port, "t.py"})));
  CHECK(store_port_free(parse({"--nnodes", "1", "--master_port", free_port, "t.py"})));
}

TEST_CASE("preflight: nothing is started when the launch cannot go on") {
  TempDir dir;
  dir.write("train.py", "", kRead);
  const fs::path ran = dir.path / "ran";
  dir.write("py", "#!/bin/sh\ntouch " + ran.string() + "\nexit 1\n", kExec);
  const std::map<std::string, std::string> env{{"PATH", dir.path.string() + ":/usr/bin:/bin"}};
  // A missing script: reported, the interpreter not started.
  CHECK(preflight(parse({"--python", "py", "tran.py"}), env, dir.path).size() == 1);
  CHECK_FALSE(fs::exists(ran));
  // A busy store port: nothing reported here (the store's own bind says "port in use", exit 3, next), and
  // the interpreter not started.
  BusyPort busy;
  CHECK(preflight(parse({"--nnodes", "1", "--master_port", std::to_string(busy.port), "--python", "py",
                         "train.py"}),
                  env, dir.path)
            .empty());
  CHECK_FALSE(fs::exists(ran));
  // --no_python: the program is not an interpreter; it is not started.
  CHECK(preflight(parse({"--no_python", "py"}), env, dir.path).empty());
  CHECK_FALSE(fs::exists(ran));
  // Otherwise the interpreter is started once, and its failure reported.
  CHECK(preflight(parse({"--python", "py", "train.py"}), env, dir.path).size() == 1);
  CHECK(fs::exists(ran));
}
