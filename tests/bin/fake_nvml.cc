// A stand-in for libnvidia-ml.so.1 (the calls agent/health/nvml.h makes), for tests on machines without a
// GPU: the agent loads it through DDPRUN_NVML_LIBRARY. Its GPUs are read from the file named by
// $DDPRUN_FAKE_NVML_STATE at every call, so a test changes them while the agent runs. One line per GPU, in
// NVML index order:
//   <uuid> <used MiB> <total MiB> <state>     state: ok | lost | remap_pending | remap_failed
// and the line "init_error" makes nvmlInit fail. Return codes and strings are NVML's.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int kSuccess = 0, kUninitialized = 1, kInvalidArgument = 2, kNotFound = 6, kGpuIsLost = 15,
              kUnknown = 999;

struct Gpu {
  std::string uuid;
  unsigned long long used = 0, total = 0;
  std::string state;
};

struct State {
  bool init_error = false;
  std::vector<Gpu> gpus;
};

State read_state() {
  State s;
  const char* path = std::getenv("DDPRUN_FAKE_NVML_STATE");
  if (!path) return s;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    Gpu g;
    if (!(words >> g.uuid)) continue;
    if (g.uuid == "init_error") {
      s.init_error = true;
      continue;
    }
    words >> g.used >> g.total >> g.state;
    g.used <<= 20;
    g.total <<= 20;
    s.gpus.push_back(g);
  }
  return s;
}

// A handle is the GPU's index + 1.
using Handle = void*;

const Gpu* gpu_of(const State& s, Handle h) {
  const auto i = reinterpret_cast<uintptr_t>(h);
  return i >= 1 && i <= s.gpus.size() ? &s.gpus[i - 1] : nullptr;
}

}  // namespace

extern "C" {

struct nvmlMemory_t {
  unsigned long long total, free, used;
};

int nvmlInit_v2() {
  return read_state().init_error ? kUnknown : kSuccess;
}
int nvmlShutdown() {
  return kSuccess;
}

const char* nvmlErrorString(int r) {
  switch (r) {
    case kSuccess:
      return "Success";
    case kUninitialized:
      return "Uninitialized";
    case kInvalidArgument:
      return "Invalid Argument";
    case kNotFound:
      return "Not Found";
    case kGpuIsLost:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = static_cast<unsigned>(read_state().gpus.size());
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, Handle* h) {
  const State s = read_state();
  if (index >= s.gpus.size()) return kInvalidArgument;
  if (s.gpus[index].state == "lost") return kGpuIsLost;
  *h = reinterpret_cast<Handle>(static_cast<uintptr_t>(index) + 1);
  return kSuccess;
}

int nvmlDeviceGetHandleByUUID(const char* uuid, Handle* h) {
  const State s = read_state();
  for (size_t i = 0; i < s.gpus.size(); ++i) {
    if (s.gpus[i].uuid != uuid) continue;
    if (s.gpus[i].state == "lost") return kGpuIsLost;
    *h = reinterpret_cast<Handle>(i + 1);
    return kSuccess;
  }
  return kNotFound;
}

int nvmlDeviceGetName(Handle h, char* name, unsigned length) {
  if (!gpu_of(read_state(), h)) return kInvalidArgument;
  std::snprintf(name, length, "Fake GPU");
  return kSuccess;
}

int nvmlDeviceGetMemoryInfo(Handle h, nvmlMemory_t* memory) {
  const State s = read_state();
  const Gpu* g = gpu_of(s, h);
  if (!g) return kInvalidArgument;
  if (g->state == "lost") return kGpuIsLost;
  memory->total = g->total;
  memory->used = g->used;
  memory->free = g->total > g->used ? g->total - g->used : 0;
  return kSuccess;
}

int nvmlDeviceGetRemappedRows(Handle h, unsigned* corrected, unsigned* uncorrected, unsigned* pending,
                              unsigned* failed) {
  const State s = read_state();
  const Gpu* g = gpu_of(s, h);
  if (!g) return kInvalidArgument;
  *corrected = 0;
  *uncorrected = g->state == "remap_pending" || g->state == "remap_failed" ? 1 : 0;
  *pending = g->state == "remap_pending";
  *failed = g->state == "remap_failed";
  return kSuccess;
}

}  // extern "C"
