// Unit tests of agent/progress_monitor: when a group counts as hung (pure, time passed in), and the /proc
// sampler on this very process.
#include "agent/watchdog/progress_monitor.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "catch_compat.h"

using namespace ddprun::agent;
using namespace std::chrono_literals;
using Clock = ProgressTracker::Clock;

TEST_CASE("no rank progressing for hang_timeout is a hang; any rank progressing is not") {
  const Clock::time_point t0{};
  ProgressTracker t(10s, t0);
  // Three ranks: two wait in a collective (almost no CPU), one sleeps.
  std::map<int, ProgressSample> s{{0, {1.0, 100, 0}}, {1, {1.0, 100, 0}}, {2, {1.0, 100, 0}}};
  t.observe(t0, s);  // first sight: progress
  for (int i = 1; i <= 9; ++i) {
    s[0].cpu_seconds += 0.004;  // 0.4% of a 1 s interval: background threads
    t.observe(t0 + i * 1s, s);
  }
  CHECK_FALSE(t.hung(t0 + 9s));
  t.observe(t0 + 10s, s);
  CHECK(t.hung(t0 + 10s));
  CHECK(t.last_progress() == t0);

  SECTION("CPU time of one rank above 5% of the interval is progress") {
    s[2].cpu_seconds += 0.06;
    t.observe(t0 + 11s, s);
    CHECK_FALSE(t.hung(t0 + 11s));
    CHECK(t.last_progress() == t0 + 11s);
  }
  SECTION("output is progress") {
    s[1].output_bytes += 1;
    t.observe(t0 + 11s, s);
    CHECK_FALSE(t.hung(t0 + 20s));
    CHECK(t.hung(t0 + 21s));
  }
  SECTION("a heartbeat is progress") {
    s[2].heartbeats = 123456789;
    t.observe(t0 + 11s, s);
    CHECK_FALSE(t.hung(t0 + 11s));
  }
  SECTION("a new worker is progress") {
    s[3] = {};
    t.observe(t0 + 11s, s);
    CHECK_FALSE(t.hung(t0 + 11s));
  }
}

TEST_CASE("the sampling interval is a tenth of the timeout, within 0.2 s and 5 s") {
  CHECK(progress_interval(15s) == 1500ms);
  CHECK(progress_interval(1s) == 200ms);
  CHECK(progress_interval(600s) == 5s);
}

TEST_CASE("process_group_cpu_seconds sees this process group's CPU time grow while it computes") {
  const pid_t me = getpgrp();
  const double before = process_group_cpu_seconds({me}).at(me);
  // Compute until this process's own CPU clock says 0.2 s went by (not wall time: the machine may be busy).
  volatile double x = 0;
  const std::clock_t start = std::clock();
  while (std::clock() - start < CLOCKS_PER_SEC / 5) x = x + 1.0;
  const double after = process_group_cpu_seconds({me}).at(me);
  CHECK(after - before >= 0.15);
  CHECK(process_group_cpu_seconds({999999999}).empty());
}

TEST_CASE("file sizes and modification times for output and heartbeats") {
  auto dir = std::filesystem::temp_directory_path() / ("ddprun-progress-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a") << "12345";
  std::ofstream(dir / "b") << "67";
  CHECK(total_file_bytes({dir / "a", dir / "b", dir / "missing", {}}) == 7);
  CHECK(modification_ns(dir / "a") > 0);
  CHECK(modification_ns(dir / "missing") == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the heartbeat file: a step, the time before the first collective, the step time") {
  auto f = std::filesystem::temp_directory_path() / ("ddprun-beat-" + std::to_string(getpid()));
  std::ofstream(f) << "                  12           0.050000           0.250000\n";
  auto beat = read_heartbeat(f);
  REQUIRE(beat);
  CHECK(beat->step == 12);
  CHECK(beat->before_collective_s == 0.05);
  CHECK(beat->step_s == 0.25);
  std::ofstream(f) << "7 0.125\n";  // a Python loop's two fields
  beat = read_heartbeat(f);
  REQUIRE(beat);
  CHECK(beat->step == 7);
  CHECK(beat->before_collective_s == 0.125);
  CHECK_FALSE(beat->step_s);
  std::ofstream(f) << "42\n";  // only a step: progress, no times
  beat = read_heartbeat(f);
  REQUIRE(beat);
  CHECK(beat->step == 42);
  CHECK_FALSE(beat->before_collective_s);
  std::ofstream(f) << "3 -1 0.5\n";  // unknown before the collective (the first step)
  beat = read_heartbeat(f);
  REQUIRE(beat);
  CHECK_FALSE(beat->before_collective_s);
  CHECK(beat->step_s == 0.5);
  std::ofstream(f) << "garbage";
  CHECK_FALSE(read_heartbeat(f));
  std::filesystem::remove(f);
  CHECK_FALSE(read_heartbeat(f));
}
