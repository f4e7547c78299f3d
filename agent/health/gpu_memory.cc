#include "agent/health/gpu_memory.h"

#include <thread>

#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPoll{50};

}  // namespace

std::map<std::string, uint64_t> gpu_memory_used(Nvml& nvml, const std::vector<std::string>& gpus) {
  std::map<std::string, uint64_t> used;
  for (const auto& gpu : gpus) {
    if (GpuState s = nvml.device(gpu); s.ok) used[gpu] = s.used_bytes;
  }
  return used;
}

GpuMemoryWait wait_for_gpu_memory(Nvml& nvml, const std::map<std::string, uint64_t>& baseline,
                                  std::chrono::milliseconds timeout, const GpuWaitPause& pause) {
  const auto start = Clock::now();
  GpuMemoryWait result;
  while (true) {
    result.still_held.clear();
    for (const auto& [gpu, before] : baseline) {
      GpuState s = nvml.device(gpu);
      if (s.ok && s.used_bytes > before + kGpuMemorySlack) {
        result.still_held.push_back("GPU " + gpu + ": " + mib_text(s.used_bytes - before) + " above the " +
                                    mib_text(before) + " it used before the job");
      }
    }
    result.waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    if (result.still_held.empty() || result.waited >= timeout) return result;
    // NVML has no event for a release: look again after kPoll.
    if (!pause) {
      std::this_thread::sleep_for(kPoll);
    } else if (pause(kPoll)) {
      result.interrupted = true;
      return result;
    }
  }
}

}  // namespace ddprun::agent
