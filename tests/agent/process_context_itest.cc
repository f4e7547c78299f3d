// Integration tests of ProcessContext: real worker processes (tests/bin/fake_worker).
#include "agent/process/process_context.h"

#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/process/prestart.h"
#include "catch_compat.h"
#include "eventually.h"
#include "temp_dir.h"

namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ddprun::agent::ExitStatus;
using ddprun::agent::ProcessContext;
using ddprun::agent::WorkerLaunch;

const std::string kFakeWorker = FAKE_WORKER_PATH;
constexpr auto kLimit = 30s;  // bound of every wait; never reached when things work

using ddprun::testing::TempDir;

// Runs io until pred() holds or kLimit passes; returns pred().
bool run_until(asio::io_context& io, const std::function<bool()>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  auto guard = asio::make_work_guard(io);
  io.restart();
  while (!pred()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    io.run_one_for(deadline - now);
  }
  return true;
}

WorkerLaunch worker(int local_rank, std::vector<std::string> args) {
  WorkerLaunch w;
  w.local_rank = local_rank;
  w.argv = {kFakeWorker};
  w.argv.insert(w.argv.end(), args.begin(), args.end());
  w.env = {{"PATH", "/usr/bin:/bin"}, {"LOCAL_RANK", std::to_string(local_rank)}};
  return w;
}

std::string read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The same text as fake_worker's --print-lines.
std::string line_text(const std::string& tag, long i, long line_bytes) {
  std::string line = tag + std::to_string(i) + ":";
  for (long k = 0; static_cast<long>(line.size()) < line_bytes; ++k) line += static_cast<char>('a' + k % 26);
  return line;
}

// Process-group id of pid from /proc/<pid>/stat, -1 if gone.
pid_t proc_pgrp(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream rest(stat.substr(paren + 1));
  char state;
  pid_t ppid, pgrp;
  rest >> state >> ppid >> pgrp;
  return rest ? pgrp : -1;
}

int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// True once the process behind pidfd has exited (any process, not only our children).
bool wait_exited(int pidfd, std::chrono::milliseconds limit) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(limit.count())) == 1;
}

std::string readlink_fd(pid_t pid, int fd) {
  std::error_code ec;
  return fs::read_symlink("/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd), ec).string();
}

// A named pipe the test reads while workers write it: a wait for their output without polling files.
class Fifo {
 public:
  explicit Fifo(fs::path path) : path_(std::move(path)) {
    REQUIRE(::mkfifo(path_.c_str(), 0600) == 0);
    read_fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    write_fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);  // so that the reader never sees end of file
    REQUIRE(read_fd_ >= 0);
    REQUIRE(write_fd_ >= 0);
  }
  ~Fifo() {
    ::close(read_fd_);
    ::close(write_fd_);
  }
  const fs::path& path() const { return path_; }
  const std::string& data() const { return data_; }

  // Reads until `needle` occurs `count` times in all that was read.
  bool wait_for(const std::string& needle, int count = 1) {
    const auto deadline = std::chrono::steady_clock::now() + kLimit;
    while (occurrences(needle) < count) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return false;
      pollfd p{read_fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) != 1) continue;
      char buf[4096];
      const ssize_t n = ::read(read_fd_, buf, sizeof buf);
      if (n > 0) data_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

 private:
  int occurrences(const std::string& needle) const {
    int n = 0;
    for (size_t pos = data_.find(needle); pos != std::string::npos; pos = data_.find(needle, pos + 1)) ++n;
    return n;
  }

  fs::path path_;
  int read_fd_ = -1, write_fd_ = -1;
  std::string data_;
};

// Sends this process's fd 1 or 2 to a file until restore() (no Catch assertion in between).
class CaptureFd {
 public:
  CaptureFd(int fd, const fs::path& file) : fd_(fd) {
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    saved_ = ::dup(fd);
    const int f = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ::dup2(f, fd);
    ::close(f);
  }
  ~CaptureFd() { restore(); }
  void restore() {
    if (saved_ < 0) return;
    std::fflush(nullptr);
    ::dup2(saved_, fd_);
    ::close(saved_);
    saved_ = -1;
  }

 private:
  int fd_;
  int saved_ = -1;
};

struct Exits {
  std::map<int, ExitStatus> status;
  std::map<int, pid_t> pid;
  ProcessContext::ExitFn fn() {
    return [this](int local_rank, pid_t p, ExitStatus s) {
      status[local_rank] = s;
      pid[local_rank] = p;
    };
  }
};

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

TEST_CASE("tee: whole prefixed lines on the console, raw bytes in the file, all before on_exit",
          "[process_context]") {
  constexpr int kWorkers = 4;
  constexpr long kLines = 2000;
  auto line_bytes = [](int i) { return 10L + 150L * i; };  // up to 460 bytes: several lines per PIPE_BUF
  auto tag = [](int i) { return "w" + std::to_string(i) + "-"; };
  auto prefix = [](int i) { return "[default" + std::to_string(i) + "]:"; };
  TempDir dir;
  asio::io_context io;
  std::map<int, ExitStatus> exits;
  std::map<int, uintmax_t> file_size_at_exit;
  ProcessContext ctx(io, [&](int local_rank, pid_t, ExitStatus s) {
    exits[local_rank] = s;
    file_size_at_exit[local_rank] = fs::file_size(dir / ("out" + std::to_string(local_rank)));
  });
  bool finished;
  {
    CaptureFd capture(STDOUT_FILENO, dir / "console");
    for (int i = 0; i < kWorkers; ++i) {
      WorkerLaunch w = worker(i, {"--print-lines", std::to_string(kLines), "--tag", tag(i), "--line-bytes",
                                  std::to_string(line_bytes(i))});
      w.stdout_prefix = prefix(i);
      w.stdout_file = dir / ("out" + std::to_string(i));
      ctx.spawn(w);
    }
    finished = run_until(io, [&] { return exits.size() == kWorkers; });
  }
  REQUIRE(finished);

  for (int i = 0; i < kWorkers; ++i) {
    CHECK(exits[i].success());
    std::string expected;
    for (long n = 0; n < kLines; ++n) expected += line_text(tag(i), n, line_bytes(i)) + "\n";
    CHECK(read_file(dir / ("out" + std::to_string(i))) == expected);
    CHECK(file_size_at_exit[i] == expected.size());
  }
  const std::string console = read_file(dir / "console");
  REQUIRE(!console.empty());
  CHECK(console.back() == '\n');
  std::istringstream lines(console);
  std::vector<long> next(kWorkers, 0);
  long bad_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    bool matched = false;
    for (int i = 0; i < kWorkers && !matched; ++i) {
      if (line.rfind(prefix(i), 0) != 0) continue;
      matched = line.substr(prefix(i).size()) == line_text(tag(i), next[i], line_bytes(i));
      if (matched) ++next[i];
    }
    if (!matched) ++bad_lines;
  }
  CHECK(bad_lines == 0);
  for (int i = 0; i < kWorkers; ++i) CHECK(next[i] == kLines);
}

TEST_CASE("long console lines are cut at 64 KiB; a last line without newline is flushed",
          "[process_context]") {
  constexpr long kBytes = 150000;
  TempDir dir;
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  bool finished;
  {
    CaptureFd capture(STDERR_FILENO, dir / "console");
    WorkerLaunch w = worker(
        0, {"--print-lines", "2", "--line-bytes", std::to_string(kBytes), "--stderr", "--no-final-newline"});
    w.stderr_prefix = "[x0]:";
    w.stderr_file = dir / "err.log";
    ctx.spawn(w);
    finished = run_until(io, [&] { return exits.status.size() == 1; });
  }
  REQUIRE(finished);
  const std::string line0 = line_text("", 0, kBytes), line1 = line_text("", 1, kBytes);
  CHECK(read_file(dir / "err.log") == line0 + "\n" + line1);
  std::string expected;
  for (const std::string& line : {line0, line1}) {
    for (size_t pos = 0; pos < line.size(); pos += 65536)
      expected += "[x0]:" + line.substr(pos, 65536) + "\n";
  }
  CHECK(read_file(dir / "console") == expected);
}

namespace {

// What the console shows of a worker that runs `shell` (a progress bar: it prints, then waits for the file
// $GO, then ends) through a pump with `prefix`: {while it waited, once it ended}. `until` is the text that
// shows the bar's last redraw arrived.
std::pair<std::string, std::string> redraws(const std::string& shell, const std::string& prefix,
                                            const std::string& until) {
  TempDir dir;
  asio::io_context io;
  Exits exits;
  ProcessContext ctx(io, exits.fn());
  const fs::path marker = dir / "go";
  std::string live;
  bool finished;
  {
    CaptureFd capture(STDOUT_FILENO, dir / "console");
    WorkerLaunch w;
    w.argv = {"/bin/sh", "-c", shell};
    w.env = {{"PATH", "/usr/bin:/bin"}, {"GO", marker.string()}};
    w.stdout_prefix = prefix;
    w.whole_lines = true;  // two workers would share the console: the lines go through the agent
    ctx.spawn(w);
    const bool seen = run_until(io, [&] {
      live = read_file(dir / "console");
      return live.find(until) != std::string::npos;
    });
    std::ofstream(marker).put('x');
    CHECK(seen);
    finished = run_until(io, [&] { return exits.status.size() == 1; });
  }
  REQUIRE(finished);
  return {live, read_file(dir / "console")};
}

constexpr const char* kWaitForGo = "while [ ! -e \"$GO\" ]; do sleep 0.05; done; ";

}  // namespace

TEST_CASE("a progress bar redrawn with carriage returns reaches the console as it goes, each redraw prefixed",
          "[process_context]") {
  // Two redraws, then it waits (still running) until the test saw them; then it ends the bar's line with a
  // '\n' of its own, and one more line ending in "\r\n".
  auto [live, all] = redraws(std::string("printf '10%%\\r'; sleep 0.2; printf '20%%\\r'; ") + kWaitForGo +
                                 "printf '\\n'; printf 'done\\r\\n'",
                             "[p0]:", "20%\r");
  CHECK(live == "[p0]:10%\r[p0]:20%\r");  // while the worker still ran
  CHECK(all == "[p0]:10%\r[p0]:20%\r\n[p0]:done\r\n");
}

TEST_CASE("a tqdm bar (a carriage return, then the bar until the next update) is shown at once",
          "[process_context]") {
  for (const std::string prefix : {"", "[p0]:"}) {
    INFO("prefix '" << prefix << "'");
    // tqdm's way: every update is "\r" + the bar; the last one is ended by "\n" when the bar closes.
    auto [live, all] = redraws(std::string("printf '\\r10%%'; sleep 0.2; printf '\\r20%%'; ") + kWaitForGo +
                                   "printf '\\n'; printf 'done\\n'",
                               prefix, "20%");
    // The second update is on the console while the worker still runs (not one update late); a redraw gets
    // the prefix once.
    CHECK(live == prefix + "\r" + prefix + "10%\r" + prefix + "20%");
    CHECK(all == live + "\n" + prefix + "done\n");
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
