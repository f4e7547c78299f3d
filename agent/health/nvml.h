// Nvml: the few NVML calls the agent makes (a GPU's health before the node joins, its memory before a
// restart), with libnvidia-ml loaded at run time: ddprun has no build dependency on the driver, and a node
// without it simply has no NVML (Nvml::load says why).
//
// The library is $DDPRUN_NVML_LIBRARY when set (another install, or the tests' fake), else
// libnvidia-ml.so.1 as the driver installs it. A GPU is named as CUDA_VISIBLE_DEVICES names it: an NVML
// index ("0"), or a UUID ("GPU-…", "MIG-…").
//
// Threads: one Nvml per thread (NVML itself is thread-safe; this class keeps no state but the library).
// Never throws except std::bad_alloc.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace ddprun::agent {

struct GpuState {
  bool ok = false;
  std::string
      problem;       // when !ok: NVML's words and what it means ("GPU is lost", "a row remapping is pending")
  std::string name;  // "NVIDIA H100 80GB HBM3"
  uint64_t used_bytes = 0, total_bytes = 0;
};

class Nvml {
 public:
  // NVML initialised, or nullopt with `why` ("libnvidia-ml.so.1: cannot open shared object file …").
  static std::unique_ptr<Nvml> load(const std::map<std::string, std::string>& env, std::string& why);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // The GPUs NVML sees (0 when it cannot count them).
  int device_count();
  // One GPU's health and memory.
  GpuState device(const std::string& gpu);

 private:
  struct Api;
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace ddprun::agent
