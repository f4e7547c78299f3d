// ProcessContext's console streams with real processes: tee, prefixed whole lines, 64 KiB line cut,
// progress bars redrawn with carriage returns.
#include "agent/process/process_context.h"

#include "process_test_util.h"

namespace {
using namespace process_test;  // NOLINT: the shared helpers
}  // namespace

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

