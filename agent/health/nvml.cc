#include "agent/health/nvml.h"

#include <dlfcn.h>

#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

// NVML's ABI (nvml.h), the parts used here.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kNotSupported = 3;
constexpr unsigned kNameLength = 96;

}  // namespace

struct Nvml::Api {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  // Optional (Ampere and later): rows remapped after uncorrectable errors.
  nvmlReturn_t (*remapped_rows)(nvmlDevice_t, unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;

  std::string error(nvmlReturn_t r) const {
    return std::string(error_string ? error_string(r) : "unknown error") + " (NVML error " +
           std::to_string(r) + ")";
  }
};

std::unique_ptr<Nvml> Nvml::load(const std::map<std::string, std::string>& env, std::string& why) {
  auto it = env.find("DDPRUN_NVML_LIBRARY");
  const std::string path = it != env.end() && !it->second.empty() ? it->second : "libnvidia-ml.so.1";
  auto api = std::make_unique<Api>();
  api->lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->lib) {
    const char* e = ::dlerror();
    why = e ? e : path + ": cannot be loaded";
    return nullptr;
  }
  auto need = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(api->lib, symbol));
    if (!fn && why.empty()) why = path + " has no " + symbol;
  };
  need(api->init, "nvmlInit_v2");
  need(api->shutdown, "nvmlShutdown");
  need(api->error_string, "nvmlErrorString");
  need(api->count, "nvmlDeviceGetCount_v2");
  need(api->by_index, "nvmlDeviceGetHandleByIndex_v2");
  need(api->by_uuid, "nvmlDeviceGetHandleByUUID");
  need(api->memory, "nvmlDeviceGetMemoryInfo");
  need(api->name, "nvmlDeviceGetName");
  if (!why.empty()) {
    ::dlclose(api->lib);
    return nullptr;
  }
  api->remapped_rows =
      reinterpret_cast<decltype(api->remapped_rows)>(::dlsym(api->lib, "nvmlDeviceGetRemappedRows"));
  if (const nvmlReturn_t r = api->init(); r != kSuccess) {
    why = "nvmlInit failed: " + api->error(r);
    ::dlclose(api->lib);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(api)));
}

Nvml::Nvml(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  ::dlclose(api_->lib);
}

int Nvml::device_count() {
  unsigned n = 0;
  return api_->count(&n) == kSuccess ? static_cast<int>(n) : 0;
}

GpuState Nvml::device(const std::string& gpu) {
  GpuState s;
  nvmlDevice_t handle = nullptr;
  const auto index = parse_uint(gpu);
  const nvmlReturn_t found =
      index ? api_->by_index(static_cast<unsigned>(*index), &handle) : api_->by_uuid(gpu.c_str(), &handle);
  if (found != kSuccess) {
    s.problem = "NVML cannot open GPU " + gpu + ": " + api_->error(found);
    return s;
  }
  char name[kNameLength] = {};
  if (api_->name(handle, name, kNameLength) == kSuccess) s.name = name;
  nvmlMemory_t memory{};
  if (const nvmlReturn_t r = api_->memory(handle, &memory); r != kSuccess) {
    s.problem = "NVML cannot read the memory of GPU " + gpu + ": " + api_->error(r);
    return s;
  }
  s.used_bytes = memory.used;
  s.total_bytes = memory.total;
  if (api_->remapped_rows) {
    unsigned corrected = 0, uncorrected = 0, pending = 0, failed = 0;
    const nvmlReturn_t r = api_->remapped_rows(handle, &corrected, &uncorrected, &pending, &failed);
    if (r == kSuccess && failed) {
      s.problem = "GPU " + gpu + " failed to remap a row after an uncorrectable memory error (replace it)";
      return s;
    }
    if (r == kSuccess && pending) {
      s.problem = "GPU " + gpu + " has a row remapping pending (reset the GPU)";
      return s;
    }
    if (r != kSuccess && r != kNotSupported) {
      s.problem = "NVML cannot read the remapped rows of GPU " + gpu + ": " + api_->error(r);
      return s;
    }
  }
  s.ok = true;
  return s;
}

}  // namespace ddprun::agent
