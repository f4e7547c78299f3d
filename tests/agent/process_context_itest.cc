// Integration tests of ProcessContext with real processes: exit statuses, environment, process groups, stop
// and signals, a SIGKILLed agent, stream wiring, spawn errors, destruction. Console streams:
// process_streams_itest.cc; standbys (--prestart): process_prestart_itest.cc.
#include "agent/process/process_context.h"

#include "process_test_util.h"

namespace {
using namespace process_test;  // NOLINT: the shared helpers
}  // namespace

TEST_CASE("exit codes and signal deaths are reported with their status", "[process_context]") {
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  const pid_t p0 = ctx.spawn(worker(0, {"--exit", "3"}));
  const pid_t p1 = ctx.spawn(worker(1, {"--signal", "SEGV"}));
  const pid_t p2 = ctx.spawn(worker(2, {}));
  const pid_t p3 = ctx.spawn(worker(3, {"--signal", "TERM"}));
  CHECK(ctx.running() == 4);
  std::vector<pid_t> expected{p0, p1, p2, p3};
  std::sort(expected.begin(), expected.end());
  CHECK(ctx.pids() == expected);

  REQUIRE(run_until(io, [&] { return exits.status.size() == 4; }));
  CHECK(exits.status[0] == ExitStatus{3, 0});
  CHECK(exits.status[0].describe() == "exit code 3");
  CHECK(exits.status[0].shell_code() == 3);
  CHECK_FALSE(exits.status[0].success());
  CHECK(exits.status[1] == ExitStatus{0, SIGSEGV});
  CHECK(exits.status[1].describe() == "signal SIGSEGV (11)");
  CHECK(exits.status[1].shell_code() == 139);
  CHECK(exits.status[2].success());
  CHECK(exits.status[2].describe() == "exit code 0");
  CHECK(exits.status[3] == ExitStatus{0, SIGTERM});
  CHECK(exits.pid[0] == p0);
  CHECK(exits.pid[1] == p1);
  CHECK(ctx.running() == 0);
  CHECK(ctx.pids().empty());
}

TEST_CASE("the environment is exactly the one given and argv[0] is found in its PATH", "[process_context]") {
  TempDir dir;
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  WorkerLaunch w;
  w.argv = {"fake_worker", "--dump-env", (dir / "env.json").string()};
  w.env = {{"PATH", "/nonexistent-dir::" + fs::path(kFakeWorker).parent_path().string()},
           {"A", "1"},
           {"SPACES", "x y  z"},
           {"EMPTY", ""},
           {"QUOTES", "say \"hi\" \\ there"},
           {"MULTILINE", "a\nb"}};
  ctx.spawn(w);
  REQUIRE(run_until(io, [&] { return exits.status.size() == 1; }));
  REQUIRE(exits.status[0].success());
  const auto dumped =
      nlohmann::json::parse(read_file(dir / "env.json")).get<std::map<std::string, std::string>>();
  CHECK(dumped == w.env);
}

TEST_CASE("fake_worker writes torch's @record error file", "[process_context]") {
  TempDir dir;
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  WorkerLaunch w = worker(0, {"--error-file"});
  w.env["TORCHELASTIC_ERROR_FILE"] = (dir / "error.json").string();
  ctx.spawn(w);
  REQUIRE(run_until(io, [&] { return exits.status.size() == 1; }));
  CHECK(exits.status[0] == ExitStatus{1, 0});
  const auto error = nlohmann::json::parse(read_file(dir / "error.json"));
  CHECK(error["message"]["message"].get<std::string>().find("RuntimeError") != std::string::npos);
  CHECK(error["message"]["extraInfo"]["py_callstack"].is_string());
  CHECK(std::stol(error["message"]["extraInfo"]["timestamp"].get<std::string>()) > 0);
}

TEST_CASE("each worker leads a process group of its own", "[process_context]") {
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  const pid_t a = ctx.spawn(worker(0, {"--hang"}));
  const pid_t b = ctx.spawn(worker(1, {"--hang"}));
  CHECK(proc_pgrp(a) == a);
  CHECK(proc_pgrp(b) == b);
  CHECK(a != ::getpgrp());
  bool done = false;
  ctx.stop(SIGTERM, 20s, [&] { done = true; });
  REQUIRE(run_until(io, [&] { return done; }));
  CHECK(exits.status[0] == ExitStatus{0, SIGTERM});
  CHECK(exits.status[1] == ExitStatus{0, SIGTERM});
}

TEST_CASE("stop: the signal first, SIGKILL after the grace period", "[process_context]") {
  TempDir dir;
  Fifo ready(dir / "ready");
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  ctx.spawn(worker(0, {"--hang"}));
  ctx.spawn(worker(1, {"--ignore-sigterm", "--pidfile", ready.path().string(), "--hang"}));
  REQUIRE(ready.wait_for("\n"));
  size_t exits_seen_by_done = 0;
  bool done = false;
  ctx.stop(SIGTERM, 300ms, [&] {
    exits_seen_by_done = exits.status.size();
    done = true;
  });
  CHECK_THROWS_AS(ctx.spawn(worker(2, {})), std::logic_error);
  REQUIRE(run_until(io, [&] { return done; }));
  CHECK(exits_seen_by_done == 2);
  CHECK(exits.status[0] == ExitStatus{0, SIGTERM});
  CHECK(exits.status[1] == ExitStatus{0, SIGKILL});
  CHECK(ctx.running() == 0);

  // The context is reusable after a stop, and a stop with nothing running completes on the next turn.
  ctx.spawn(worker(5, {"--exit", "4"}));
  REQUIRE(run_until(io, [&] { return exits.status.count(5) == 1; }));
  CHECK(exits.status[5] == ExitStatus{4, 0});
  done = false;
  ctx.stop(SIGTERM, 1s, [&] { done = true; });
  CHECK_FALSE(done);
  REQUIRE(run_until(io, [&] { return done; }));
}

TEST_CASE("stop kills grandchildren left in a worker's process group", "[process_context]") {
  TempDir dir;
  Fifo out(dir / "out");
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  WorkerLaunch w = worker(0, {"--spawn-grandchild", "--hang"});
  w.stdout_file = out.path();
  w.console_stdout = false;
  const pid_t pid = ctx.spawn(w);
  REQUIRE(out.wait_for("\n"));
  pid_t grandchild = 0;
  REQUIRE(std::sscanf(out.data().c_str(), "grandchild %d", &grandchild) == 1);
  const int grandchild_fd = pidfd_open(grandchild);
  REQUIRE(grandchild_fd >= 0);
  CHECK(proc_pgrp(grandchild) == pid);

  bool done = false;
  ctx.stop(SIGTERM, 20s, [&] { done = true; });
  REQUIRE(run_until(io, [&] { return done; }));
  CHECK(exits.status[0] == ExitStatus{0, SIGTERM});  // the grandchild ignores SIGTERM: only SIGKILL ends it
  CHECK(wait_exited(grandchild_fd, kLimit));
  ::close(grandchild_fd);
}

TEST_CASE("signal_all delivers a signal to every worker's group", "[process_context]") {
  TempDir dir;
  Fifo record(dir / "record");
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  ctx.spawn(worker(0, {"--record-signals", record.path().string(), "--hang"}));
  ctx.spawn(worker(1, {"--record-signals", record.path().string(), "--hang"}));
  REQUIRE(record.wait_for("ready\n", 2));
  ctx.signal_all(SIGUSR1);
  REQUIRE(run_until(io, [&] { return exits.status.size() == 2; }));
  CHECK(exits.status[0] == ExitStatus{128 + SIGUSR1, 0});
  CHECK(exits.status[1] == ExitStatus{128 + SIGUSR1, 0});
  CHECK(record.wait_for("USR1\n", 2));
}

TEST_CASE("no worker outlives a SIGKILLed agent (PR_SET_PDEATHSIG)", "[process_context]") {
  constexpr int kWorkers = 3;
  int pipe_fds[2];
  REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
  const pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {  // the "agent": spawns workers, reports their pids, waits to be killed
    ::close(pipe_fds[0]);
    try {
      asio::io_context io;
      ProcessContext ctx(io, {});
      std::string pids;
      for (int i = 0; i < kWorkers; ++i) pids += std::to_string(ctx.spawn(worker(i, {"--hang"}))) + "\n";
      if (::write(pipe_fds[1], pids.data(), pids.size()) == static_cast<ssize_t>(pids.size())) {
        for (;;) ::pause();
      }
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(pipe_fds[1]);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  while (std::count(text.begin(), text.end(), '\n') < kWorkers &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd p{pipe_fds[0], POLLIN, 0};
    if (::poll(&p, 1, 1000) != 1) continue;
    char buf[256];
    const ssize_t n = ::read(pipe_fds[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  std::vector<int> pidfds;
  std::istringstream lines(text);
  for (pid_t pid; lines >> pid;) pidfds.push_back(pidfd_open(pid));
  ::kill(agent, SIGKILL);
  ::waitpid(agent, nullptr, 0);
  REQUIRE(pidfds.size() == kWorkers);
  for (int fd : pidfds) {
    REQUIRE(fd >= 0);
    CHECK(wait_exited(fd, kLimit));
    ::close(fd);
  }
}

TEST_CASE("stdout/stderr wiring: file itself, inherited fd, pipe, /dev/null", "[process_context]") {
  TempDir dir;
  Fifo ready(dir / "ready");
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());

  WorkerLaunch direct = worker(0, {"--pidfile", ready.path().string(), "--hang"});
  direct.stdout_file = dir / "out0.log";
  direct.console_stdout = false;
  direct.console_stderr = false;
  WorkerLaunch inherit = worker(1, {"--pidfile", ready.path().string(), "--hang"});
  WorkerLaunch piped = worker(2, {"--pidfile", ready.path().string(), "--hang"});
  piped.stdout_prefix = piped.stderr_prefix = "[p2]:";
  const int leaky_fd = ::open((dir / "leak").c_str(), O_WRONLY | O_CREAT, 0600);  // no O_CLOEXEC
  const pid_t p0 = ctx.spawn(direct), p1 = ctx.spawn(inherit), p2 = ctx.spawn(piped);
  ::close(leaky_fd);
  REQUIRE(ready.wait_for("\n", 3));
  std::set<std::string> targets;  // what the worker's fds point to: the agent's leaky fd must not be there
  for (const auto& entry : fs::directory_iterator("/proc/" + std::to_string(p1) + "/fd")) {
    targets.insert(readlink_fd(p1, std::stoi(entry.path().filename().string())));
  }
  CHECK(targets.count((dir / "leak").string()) == 0);
  CHECK(targets.count(readlink_fd(p1, 1)) == 1);
  CHECK(fs::path(readlink_fd(p0, 1)) == dir / "out0.log");
  CHECK(readlink_fd(p0, 2) == "/dev/null");
  CHECK(readlink_fd(p1, 1) == readlink_fd(::getpid(), 1));
  CHECK(readlink_fd(p1, 2) == readlink_fd(::getpid(), 2));
  CHECK(readlink_fd(p2, 1).rfind("pipe:", 0) == 0);
  CHECK(readlink_fd(p2, 2).rfind("pipe:", 0) == 0);
  bool done = false;
  ctx.stop(SIGKILL, 20s, [&] { done = true; });
  REQUIRE(run_until(io, [&] { return done; }));

  WorkerLaunch printer = worker(3, {"--print-lines", "10", "--no-final-newline"});
  printer.stdout_file = dir / "out3.log";
  printer.console_stdout = false;
  ctx.spawn(printer);
  REQUIRE(run_until(io, [&] { return exits.status.count(3) == 1; }));
  std::string expected;
  for (long n = 0; n < 10; ++n) expected += (n ? "\n" : "") + line_text("", n, 0);
  CHECK(read_file(dir / "out3.log") == expected);
}

TEST_CASE("spawn errors name the program or the file", "[process_context]") {
  TempDir dir;
  asio::io_context io;
  ProcessContext ctx(io, {});
  auto spawn_error = [&](const WorkerLaunch& w) -> std::string {
    try {
      ctx.spawn(w);
    } catch (const std::system_error& e) {
      return e.what();
    }
    return "";
  };
  WorkerLaunch missing = worker(0, {});
  missing.argv = {"ddprun-no-such-program", "--x"};
  const std::string not_found = spawn_error(missing);
  CHECK(not_found.find("'ddprun-no-such-program' not found") != std::string::npos);
  CHECK(not_found.find("local_rank 0") != std::string::npos);
  missing.argv = {"/nonexistent-dir/prog"};
  CHECK(spawn_error(missing).find("'/nonexistent-dir/prog'") != std::string::npos);
  missing.argv = {"/tmp"};
  CHECK(spawn_error(missing).find("'/tmp'") != std::string::npos);
  WorkerLaunch bad_file = worker(1, {});
  bad_file.stdout_file = dir / "no-such-dir" / "stdout.log";
  CHECK(spawn_error(bad_file).find("stdout.log") != std::string::npos);
  CHECK_THROWS_AS(ctx.spawn(WorkerLaunch{}), std::invalid_argument);
  CHECK(ctx.running() == 0);
}

TEST_CASE("destroying the context kills and reaps its workers", "[process_context]") {
  asio::io_context io;
  bool called = false;
  int pidfd = -1;
  pid_t pid = -1;
  {
    ProcessContext ctx(io, [&](int, pid_t, ExitStatus) { called = true; });
    pid = ctx.spawn(worker(0, {"--hang"}));
    pidfd = pidfd_open(pid);
    REQUIRE(pidfd >= 0);
  }
  CHECK(wait_exited(pidfd, 0ms));  // already: the destructor reaped it
  CHECK(::waitpid(pid, nullptr, WNOHANG) == -1);
  ::close(pidfd);
  io.restart();
  io.poll();
  CHECK_FALSE(called);
}

