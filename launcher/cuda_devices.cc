#include "launcher/cuda_devices.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "launcher/flag_values.h"
#include "rendezvous/text_util.h"

namespace ddprun::launcher {

int visible_cuda_devices(int physical, const std::optional<std::string>& cuda_visible_devices) {
  if (!cuda_visible_devices) return physical;
  std::set<std::string> seen;
  int count = 0;
  for (const auto& raw : split(*cuda_visible_devices, ',')) {
    std::string item = trim(raw);
    if (item.empty() || !seen.insert(item).second) break;
    if (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) {
      ++count;
      continue;
    }
    auto v = to_int(item);
    if (!v || *v < 0 || *v >= physical) break;
    ++count;
  }
  return std::min(count, physical);
}

int count_cuda_devices() {
  namespace fs = std::filesystem;
  std::error_code ec;
  int physical = 0;
  for (const auto& e : fs::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)e;
    ++physical;
  }
  if (physical == 0) {
    for (const auto& e : fs::directory_iterator("/dev", ec)) {
      std::string name = e.path().filename().string();
      if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
          name.find_first_not_of("0123456789", 6) == std::string::npos) {
        ++physical;
      }
    }
  }
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible_cuda_devices(physical, cvd ? std::optional<std::string>(cvd) : std::nullopt);
}

}  // namespace ddprun::launcher
