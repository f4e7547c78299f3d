// ProcessContext's standbys (--prestart) with a real Python: the released worker's argv, environment,
// streams and exit code, a script's exception, a standby that ended early, destruction.
#include "agent/process/process_context.h"

#include "process_test_util.h"

namespace {
using namespace process_test;  // NOLINT: the shared helpers
}  // namespace

namespace {

// A Python for the standby tests: any python3 (the stub's warm-up import of torch may fail; it goes on).
struct PrestartSetup {
  TempDir dir;
  std::string python = ddprun::agent::find_program("python3", {}, "the standby tests");
  fs::path stub = dir / "ddprun_prestart.py";
  fs::path script = dir / "worker.py";

  PrestartSetup() {
    std::ofstream(stub) << ddprun::agent::prestart_stub_source();
    std::ofstream(script) << R"PY(import os, sys
def fail():
    raise ValueError("boom " + os.environ["RANK"])
initial = open("/proc/self/environ", "rb").read().split(b"\0")
print("argv", sys.argv, "rank", os.environ["RANK"], "name", __name__, "path0", sys.path[0], flush=True)
print("modelled", b"MODEL=1" in initial, os.environ.get("MODEL"), file=sys.stderr, flush=True)
if os.environ.get("FAIL"):
    fail()
sys.exit(int(os.environ["CODE"]))
)PY";
  }
  WorkerLaunch launch(std::vector<std::string> args, std::map<std::string, std::string> env) const {
    WorkerLaunch w;
    w.argv = {python, "-u", script.string()};
    w.argv.insert(w.argv.end(), args.begin(), args.end());
    w.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}};
    w.env.insert(env.begin(), env.end());
    w.console_stdout = w.console_stderr = false;
    return w;
  }
};

}  // namespace

TEST_CASE("a standby runs the released worker in its own process: argv, environment, streams, exit code",
          "[process_context][prestart]") {
  PrestartSetup s;
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  ctx.prestart(s.launch({"old"}, {{"RANK", "0"}, {"CODE", "0"}, {"MODEL", "1"}}), 2, s.stub);
  CHECK(ctx.standbys() == std::vector<int>{0});
  CHECK(ctx.running() == 0);

  WorkerLaunch w = s.launch({"new", "arg"}, {{"RANK", "5"}, {"CODE", "7"}});
  w.stdout_file = s.dir / "out.log";
  w.stderr_file = s.dir / "err.log";
  const pid_t pid = ctx.spawn(w);
  CHECK(ctx.standbys().empty());
  REQUIRE(run_until(io, [&] { return exits.status.count(0) == 1; }));
  CHECK(exits.pid[0] == pid);
  CHECK(exits.status[0] == ExitStatus{7, 0});
  const std::string dir = fs::canonical(s.dir / ".").string();
  CHECK(read_file(s.dir / "out.log") ==
        "argv ['" + s.script.string() + "', 'new', 'arg'] rank 5 name __main__ path0 " + dir + "\n");
  // The process began as the standby (its initial environment has MODEL=1); the script sees only w.env.
  CHECK(read_file(s.dir / "err.log") == "modelled True None\n");
}

TEST_CASE("a released script's uncaught exception: Python's report without the stub's frames, exit code 1",
          "[process_context][prestart]") {
  PrestartSetup s;
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  ctx.prestart(s.launch({}, {{"RANK", "0"}}), 2, s.stub);
  WorkerLaunch w = s.launch({}, {{"RANK", "3"}, {"FAIL", "1"}, {"CODE", "0"}});
  w.stderr_file = s.dir / "err.log";
  ctx.spawn(w);
  REQUIRE(run_until(io, [&] { return exits.status.count(0) == 1; }));
  CHECK(exits.status[0] == ExitStatus{1, 0});
  const std::string err = read_file(s.dir / "err.log");
  INFO(err);
  CHECK(err.rfind("modelled False None\nTraceback (most recent call last):\n  File \"" + s.script.string(),
                  0) == 0);
  CHECK(err.find("in fail\n") != std::string::npos);
  CHECK(err.find("ValueError: boom 3\n") != std::string::npos);
  CHECK(err.find("ddprun_prestart.py") == std::string::npos);
  CHECK(err.find("runpy") == std::string::npos);
}

TEST_CASE("a standby that ended before it was needed is reaped, and the worker starts afresh",
          "[process_context][prestart]") {
  PrestartSetup s;
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  ctx.prestart(s.launch({}, {{"RANK", "0"}}), 2, s.dir / "no-such-stub.py");  // python exits 2 at once
  REQUIRE(run_until(io, [&] { return ctx.standbys().empty(); }));
  WorkerLaunch w = s.launch({}, {{"RANK", "1"}, {"CODE", "4"}, {"MODEL", "1"}});
  w.stderr_file = s.dir / "err.log";
  ctx.spawn(w);
  REQUIRE(run_until(io, [&] { return exits.status.count(0) == 1; }));
  CHECK(exits.status[0] == ExitStatus{4, 0});
  CHECK(read_file(s.dir / "err.log") == "modelled True 1\n");  // a fresh process: w.env from the start
}

TEST_CASE("destroying the context ends its standbys", "[process_context][prestart]") {
  PrestartSetup s;
  int pidfd = -1;
  {
    asio::io_context io;
    ProcessContext ctx(io, {});
    ctx.prestart(s.launch({}, {{"RANK", "0"}}), 2, s.stub);
    // The standby by its command line. Polled: a python3 on PATH may be a launcher that execs the real one
    // (pyenv's shim: bash, then python), and a process in the middle of an exec shows an empty command line.
    pid_t standby = -1;
    REQUIRE(ddprun::testing::eventually([&] {
      for (const auto& entry : fs::directory_iterator("/proc")) {
        const std::string name = entry.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        if (read_file(entry.path() / "cmdline").find(s.stub.string()) != std::string::npos) {
          standby = std::stoi(name);
          return true;
        }
      }
      return false;
    }));
    pidfd = pidfd_open(standby);
    REQUIRE(pidfd >= 0);
  }
  CHECK(wait_exited(pidfd, 0ms));  // reaped by the destructor, not merely signalled
  ::close(pidfd);
}

