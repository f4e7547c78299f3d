// The GPU memory of a generation of workers, released before the next one starts (as NVIDIA's ft_launcher
// waits for it): a process that has exited may hold its GPU memory for a while longer (the driver tears its
// context down; a descendant that escaped still runs), and the new generation would start short of memory
// or fail to allocate.
//
// The agent takes each GPU's used memory before its first workers start (the baseline: other tenants, the
// driver's own) and, before each restart, waits until every GPU is back to the baseline plus kGpuMemorySlack,
// looking every 50 ms, for at most HealthPolicy::gpu_memory_wait; then it goes on and logs what is still
// held.
//
// Threads: the agent's loop thread. Never throws except std::bad_alloc.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "agent/health/nvml.h"

namespace ddprun::agent {

constexpr uint64_t kGpuMemorySlack = uint64_t{256} << 20;

// Used bytes of each GPU NVML can read, by name.
std::map<std::string, uint64_t> gpu_memory_used(Nvml& nvml, const std::vector<std::string>& gpus);

struct GpuMemoryWait {
  std::chrono::milliseconds waited{0};
  std::vector<std::string> still_held;  // "GPU 1: 2048 MiB above the 512 MiB it used before the job"
  bool interrupted = false;             // `pause` ended the wait
};

// Waits until each GPU of `baseline` uses no more than its baseline + kGpuMemorySlack, or `timeout`, or
// `pause` returns true. `pause(d)` waits up to `d` between two looks and returns true when the wait must end
// now (the agent's loop: an event arrived, such as the round's stop or a signal); by default it sleeps.
using GpuWaitPause = std::function<bool(std::chrono::milliseconds)>;
GpuMemoryWait wait_for_gpu_memory(Nvml& nvml, const std::map<std::string, uint64_t>& baseline,
                                  std::chrono::milliseconds timeout, const GpuWaitPause& pause = {});

}  // namespace ddprun::agent
