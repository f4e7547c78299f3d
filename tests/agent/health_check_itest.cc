// The node's health checks (agent/health/health_check.h) with real commands, real files and a stand-in NVML
// library (tests/bin/fake_nvml.cc, loaded by dlopen as libnvidia-ml would be), and the wait for a previous
// generation's GPU memory (agent/health/gpu_memory.h).
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "agent/health/gpu_memory.h"
#include "agent/health/health_check.h"
#include "agent/process/run_command.h"
#include "catch_compat.h"
#include "temp_dir.h"

using namespace ddprun::agent;
using namespace std::chrono_literals;
using ddprun::testing::TempDir;
using Clock = std::chrono::steady_clock;

namespace {

// A fake NVML with the GPUs of `state` (fake_nvml.cc's lines), changed by rewriting that file.
struct FakeGpus {
  TempDir dir;
  std::string file = (dir.path / "gpus").string();
  Env env{{"DDPRUN_NVML_LIBRARY", FAKE_NVML_PATH}, {"DDPRUN_FAKE_NVML_STATE", file}};

  explicit FakeGpus(const std::string& state) {
    set(state);
    ::setenv("DDPRUN_FAKE_NVML_STATE", file.c_str(), 1);  // the library reads its own process's environment
  }
  void set(const std::string& state) const {
    const std::string tmp = file + ".tmp";
    std::ofstream(tmp) << state;
    std::filesystem::rename(tmp, file);
  }
  std::unique_ptr<Nvml> load() const {
    std::string why;
    auto nvml = Nvml::load(env, why);
    INFO(why);
    REQUIRE(nvml);
    return nvml;
  }
};

AgentConfig config_with(int local_ranks, Env env = {}) {
  AgentConfig c;
  c.workers.resize(static_cast<size_t>(local_ranks));
  c.base_env = std::move(env);
  c.base_env["PATH"] = "/usr/bin:/bin";
  return c;
}

}  // namespace

TEST_CASE("nvml: a node without libnvidia-ml has no NVML, and says why", "[agent][health]") {
  std::string why;
  auto nvml = Nvml::load({{"DDPRUN_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"}}, why);
  CHECK_FALSE(nvml);
  CHECK_THAT(why, Catch::Contains("/nonexistent/libnvidia-ml.so.1"));
}

TEST_CASE("nvml: a failing nvmlInit is no NVML", "[agent][health]") {
  FakeGpus gpus("init_error\n");
  std::string why;
  CHECK_FALSE(Nvml::load(gpus.env, why));
  CHECK_THAT(why, Catch::Contains("nvmlInit failed"));
}

TEST_CASE("nvml: GPUs by index and UUID, healthy or not", "[agent][health]") {
  FakeGpus gpus(
      "GPU-aaaa 100 1000 ok\nGPU-bbbb 0 1000 lost\nGPU-cccc 0 1000 remap_pending\nGPU-dddd 0 1000 "
      "remap_failed\n");
  auto nvml = gpus.load();
  CHECK(nvml->device_count() == 4);
  GpuState a = nvml->device("0");
  CHECK(a.ok);
  CHECK(a.used_bytes == 100ull << 20);
  CHECK(a.total_bytes == 1000ull << 20);
  CHECK(a.name == "Fake GPU");
  CHECK(nvml->device("GPU-aaaa").ok);
  GpuState lost = nvml->device("1");
  CHECK_FALSE(lost.ok);
  CHECK_THAT(lost.problem, Catch::Contains("GPU is lost"));
  CHECK_THAT(nvml->device("GPU-cccc").problem, Catch::Contains("row remapping pending"));
  CHECK_THAT(nvml->device("3").problem, Catch::Contains("failed to remap a row"));
  CHECK_THAT(nvml->device("GPU-zzzz").problem, Catch::Contains("Not Found"));
}

TEST_CASE("health: the GPUs a node's local ranks use", "[agent][health]") {
  const NodeGpus indices = node_gpus({}, 3);
  CHECK(indices.ids == std::vector<std::string>{"0", "1", "2"});
  CHECK_FALSE(indices.listed);
  const NodeGpus named = node_gpus({{"CUDA_VISIBLE_DEVICES", "3, GPU-x,5"}}, 2);
  CHECK(named.ids == std::vector<std::string>{"3", "GPU-x"});
  CHECK(named.listed);
  CHECK(node_gpus({{"CUDA_VISIBLE_DEVICES", ""}}, 2).ids.empty());
}

TEST_CASE("health: a broken GPU makes the node unhealthy; GPUs beyond the machine's are not asked for",
          "[agent][health]") {
  FakeGpus gpus("GPU-aaaa 0 1000 ok\nGPU-bbbb 0 1000 lost\n");
  auto nvml = gpus.load();
  // Ranks 0 and 1 use GPUs 0 and 1: GPU 1 is lost.
  HealthReport two = check_health(config_with(2), nvml.get());
  REQUIRE(two.problems.size() == 1);
  CHECK_THAT(two.summary(), Catch::Contains("GPU 1"));
  // Only GPU 0 used: healthy; 4 ranks on a 2-GPU machine without CUDA_VISIBLE_DEVICES: GPUs 2, 3 not asked.
  CHECK(check_health(config_with(1), nvml.get()).healthy() == true);
  gpus.set("GPU-aaaa 0 1000 ok\nGPU-bbbb 0 1000 ok\n");
  CHECK(check_health(config_with(4), nvml.get()).healthy());
  // Named by CUDA_VISIBLE_DEVICES, a missing GPU is a problem.
  HealthReport named = check_health(config_with(1, {{"CUDA_VISIBLE_DEVICES", "GPU-cccc"}}), nvml.get());
  CHECK_THAT(named.summary(), Catch::Contains("GPU-cccc"));
  // --health_check_builtin off: no GPU is asked.
  gpus.set("GPU-aaaa 0 1000 lost\n");
  AgentConfig off = config_with(1);
  off.health.builtin = false;
  CHECK(check_health(off, nvml.get()).healthy());
  CHECK_FALSE(check_health(config_with(1), nvml.get()).healthy());
}

TEST_CASE("health: room in a directory", "[agent][health]") {
  TempDir dir;
  CHECK(room_problem("--log_dir", dir.path.string(), 0).empty());
  const std::string p = room_problem("--log_dir", dir.path.string(), uint64_t{1} << 62);
  CHECK_THAT(p, Catch::Contains(dir.path.string()));
  CHECK_THAT(p, Catch::Contains("MiB needed"));
  CHECK_THAT(room_problem("/dev/shm", "/nonexistent-dir", 1), Catch::Contains("cannot be read"));
}

TEST_CASE("health: --log_dir must exist, be writable and have room", "[agent][health]") {
  TempDir dir;
  AgentConfig c = config_with(1);
  c.log_dir = dir.path;
  CHECK(check_health(c, nullptr).healthy());
  c.health.log_dir_min_free = uint64_t{1} << 62;
  CHECK_THAT(check_health(c, nullptr).summary(), Catch::Contains("free"));
  c.log_dir = dir.path / "gone";
  CHECK_THAT(check_health(c, nullptr).summary(), Catch::Contains("is not writable"));
}

TEST_CASE("health: /dev/shm must hold the worker SDK's segment", "[agent][health]") {
  // The largest slot the SDK takes (1 GiB), 8 local ranks: 4 x (n + 1) + 8 slots, 44 GiB: no /dev/shm here.
  AgentConfig c = config_with(8, {{"DDPRUN_SHM_SLOT_BYTES", std::to_string(uint64_t{1} << 30)}});
  CHECK_THAT(check_health(c, nullptr).summary(), Catch::Contains("/dev/shm"));
  CHECK(check_health(config_with(2), nullptr).healthy());
  CHECK(check_health(config_with(1, c.base_env), nullptr).healthy());  // one local rank: no segment
  // A value the SDK refuses (it says so at init) is not this node's health: no check, no wrapped size.
  for (const char* refused : {"1125899906842624", "-1", "64K", "100"}) {
    CAPTURE(refused);
    CHECK(check_health(config_with(2, {{"DDPRUN_SHM_SLOT_BYTES", refused}}), nullptr).healthy());
  }
}

TEST_CASE("health: --health_check passes on exit 0 and fails otherwise, with its last line",
          "[agent][health]") {
  TempDir dir;
  AgentConfig c = config_with(2, {{"CUDA_VISIBLE_DEVICES", "4,5"}});
  const std::string seen = (dir.path / "env").string();
  c.health.command = "echo \"$DDPRUN_HEALTH_GPUS $LOCAL_WORLD_SIZE\" > " + seen + "; echo fine";
  CHECK(check_health(c, nullptr).healthy());
  std::ifstream in(seen);
  std::string line;
  std::getline(in, line);
  CHECK(line == "4,5 2");
  c.health.command = "echo first; echo 'no InfiniBand port is up' >&2; exit 3";
  HealthReport bad = check_health(c, nullptr);
  REQUIRE_FALSE(bad.healthy());
  CHECK_THAT(bad.summary(), Catch::Contains("exited with 3: no InfiniBand port is up"));
  c.health.command = "kill -SEGV $$";
  CHECK_THAT(check_health(c, nullptr).summary(), Catch::Contains("was killed by SIGSEGV"));
}

TEST_CASE("health: a --health_check that outlives its timeout is killed with its children",
          "[agent][health]") {
  AgentConfig c = config_with(1);
  c.health.command = "sleep 30 & sleep 30";
  c.health.command_timeout = 300ms;
  const auto start = Clock::now();
  HealthReport r = check_health(c, nullptr);
  CHECK(Clock::now() - start < 10s);
  CHECK_THAT(r.summary(), Catch::Contains("did not finish within 300 ms"));
}

TEST_CASE("run_command: a program that cannot start, and one whose output is longer than kept",
          "[agent][health]") {
  std::string out;
  const int missing = run_command({.exe = "/nonexistent/prog", .argv = {"prog"}}, out);
  CHECK(missing < kCommandTimedOut);
  CHECK_THAT(command_outcome(missing, 1s), Catch::Contains("could not be started"));
  out.clear();
  const int status = run_command({.exe = "/bin/sh",
                                  .argv = {"sh", "-c", "head -c 100000 /dev/zero"},
                                  .capture_stdout = true,
                                  .max_output = 10},
                                 out);
  CHECK(WIFEXITED(status));
  CHECK(out.size() == 10);
}

TEST_CASE("gpu memory: a restart waits until the old generation's memory is back to the baseline",
          "[agent][health]") {
  FakeGpus gpus("GPU-aaaa 100 8000 ok\nGPU-bbbb 300 8000 ok\n");
  auto nvml = gpus.load();
  const auto baseline = gpu_memory_used(*nvml, {"0", "1"});
  CHECK(baseline.at("0") == 100ull << 20);
  // The old generation still holds 5 GB on GPU 1; released 300 ms later.
  gpus.set("GPU-aaaa 200 8000 ok\nGPU-bbbb 5300 8000 ok\n");
  std::thread release([&] {
    std::this_thread::sleep_for(300ms);
    gpus.set("GPU-aaaa 200 8000 ok\nGPU-bbbb 400 8000 ok\n");  // within kGpuMemorySlack of the baseline
  });
  GpuMemoryWait w = wait_for_gpu_memory(*nvml, baseline, 20s);
  release.join();
  CHECK(w.still_held.empty());
  CHECK(w.waited >= 250ms);
}

TEST_CASE("gpu memory: memory never released is waited for until the timeout, then named",
          "[agent][health]") {
  FakeGpus gpus("GPU-aaaa 100 8000 ok\n");
  auto nvml = gpus.load();
  const auto baseline = gpu_memory_used(*nvml, {"0"});
  gpus.set("GPU-aaaa 2148 8000 ok\n");
  GpuMemoryWait w = wait_for_gpu_memory(*nvml, baseline, 200ms);
  REQUIRE(w.still_held.size() == 1);
  CHECK(w.still_held[0] == "GPU 0: 2048 MiB above the 100 MiB it used before the job");
  CHECK(w.waited >= 200ms);
}

TEST_CASE("gpu memory: the wait ends when its pause says so (an event for the agent loop)",
          "[agent][health]") {
  FakeGpus gpus("GPU-aaaa 100 8000 ok\n");
  auto nvml = gpus.load();
  const auto baseline = gpu_memory_used(*nvml, {"0"});
  gpus.set("GPU-aaaa 2148 8000 ok\n");
  int looks = 0;
  GpuMemoryWait w = wait_for_gpu_memory(*nvml, baseline, 20s, [&](std::chrono::milliseconds between) {
    CHECK(between > 0ms);
    return ++looks == 3;  // the third pause: an event arrived
  });
  CHECK(w.interrupted);
  CHECK(looks == 3);
  CHECK(w.waited < 20s);
  CHECK(w.still_held.size() == 1);
}
