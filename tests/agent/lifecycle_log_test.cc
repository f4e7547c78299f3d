// Unit test of agent/observe/lifecycle_log.h: one JSON line per event, the common fields first, appended.
#include "agent/observe/lifecycle_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

using ddprun::agent::EventFields;
using ddprun::agent::LifecycleLog;

namespace {

std::vector<std::string> lines_of(const std::filesystem::path& f) {
  std::ifstream in(f);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("event log: JSON lines appended, common fields first, off until opened") {
  const auto f = std::filesystem::temp_directory_path() / ("ddprun-events-" + std::to_string(::getpid()));
  std::ofstream(f) << "{\"earlier\": true}\n";  // an existing file is appended to
  LifecycleLog off;
  off.record("round_formed");  // nothing happens
  CHECK_FALSE(off.on());

  LifecycleLog log;
  log.open(f, "job1", "node-a");
  REQUIRE(log.on());
  log.record("node_unhealthy", {{"reason", "GPU 0: \"row remapping pending\""}, {"attempt", 1}});
  log.set_round(2);
  log.record("worker_exit", {{"rank", 3}, {"exit_code", nullptr}, {"signal", "SIGKILL"}});
  const auto lines = lines_of(f);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "{\"earlier\": true}");
  CHECK_THAT(lines[1], Catch::StartsWith("{\"v\":1,\"time\":"));
  CHECK_THAT(
      lines[1],
      Catch::EndsWith(",\"event\":\"node_unhealthy\",\"run_id\":\"job1\",\"host\":\"node-a\",\"agent_pid\":" +
                      std::to_string(::getpid()) +
                      ",\"round\":null,\"reason\":\"GPU 0: \\\"row remapping pending\\\"\",\"attempt\":1}"));
  const auto parsed = EventFields::parse(lines[2]);
  CHECK(parsed["round"] == 2);
  CHECK(parsed["rank"] == 3);
  CHECK(parsed["exit_code"].is_null());
  CHECK(parsed["signal"] == "SIGKILL");
  std::filesystem::remove(f);
}

TEST_CASE("event log: a path that cannot be opened is an error naming it") {
  LifecycleLog log;
  CHECK_THROWS_AS(log.open("/nonexistent-dir/events.jsonl", "job1", "h"), std::system_error);
  CHECK_THROWS_WITH(
      log.open("/nonexistent-dir/events.jsonl", "job1", "h"),
      Catch::Contains("/nonexistent-dir/events.jsonl") && Catch::Contains("--event_log_handler file:PATH"));
}

TEST_CASE("event log: a FIFO without a reader is an error at once, not a hang") {
  const auto f =
      std::filesystem::temp_directory_path() / ("ddprun-events-fifo-" + std::to_string(::getpid()));
  std::filesystem::remove(f);
  REQUIRE(::mkfifo(f.c_str(), 0600) == 0);
  LifecycleLog log;
  CHECK_THROWS_WITH(log.open(f, "job1", "h"),
                    Catch::Contains("a FIFO with no reader: start its reader first"));
  std::filesystem::remove(f);
}

TEST_CASE("event log: a pipe whose reader stalls drops events, never half a line, and the log stays on") {
  const auto f =
      std::filesystem::temp_directory_path() / ("ddprun-events-pipe-" + std::to_string(::getpid()));
  std::filesystem::remove(f);
  REQUIRE(::mkfifo(f.c_str(), 0600) == 0);
  const int reader = ::open(f.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  LifecycleLog log;
  log.open(f, "job1", "node-a");
  // Lines longer than the pipe's atomic size, until the pipe (64 KiB) is full and events are dropped.
  const std::string detail(6000, 'x');
  int recorded = 0;
  while (log.dropped_events() == 0 && recorded < 100) {
    log.record("round_end", {{"detail", detail}, {"n", recorded}});
    ++recorded;
  }
  REQUIRE(log.dropped_events() > 0);
  REQUIRE(log.on());
  // The reader drains the pipe: the next event is written; every line read is a whole event.
  std::string got;
  char buf[65536];
  for (ssize_t n; (n = ::read(reader, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  log.record("agent_exit", {{"exit_code", 0}});
  for (ssize_t n; (n = ::read(reader, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = got.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(got.substr(at, nl - at));
  CHECK(got.back() == '\n');
  REQUIRE(lines.size() >= 2);
  for (const auto& line : lines) CHECK_NOTHROW(EventFields::parse(line));
  CHECK(EventFields::parse(lines.back())["event"] == "agent_exit");
  CHECK(lines.size() + log.dropped_events() == static_cast<size_t>(recorded) + 1);
  ::close(reader);
  std::filesystem::remove(f);
}
