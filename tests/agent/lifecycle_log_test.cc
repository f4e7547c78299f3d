// Unit test of agent/observe/lifecycle_log.h: one JSON line per event, the common fields first, appended.
#include "agent/observe/lifecycle_log.h"

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
