#include "launcher/cuda_devices.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <vector>

#include "launcher/flag_values.h"
#include "rendezvous/util/text_util.h"

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

namespace {

// Python's _strtoul of torch.cuda: the integer that the leading [+-]digits of `s` spell, -1 when none.
long long strtoul_prefix(const std::string& s) {
  size_t end = 0;
  while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) ||
                            (end == 0 && (s[end] == '+' || s[end] == '-')))) {
    ++end;
  }
  auto v = end > 0 ? to_int(s.substr(0, end)) : std::nullopt;
  return v ? *v : -1;
}

std::optional<std::string> env_value(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
}

// The first line "<key> <value>" of a KFD properties file with that key, as a number; -1 when absent.
long long kfd_property(const std::filesystem::path& file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + " ", 0) != 0) continue;
    auto v = to_int(line.substr(key.size() + 1));
    return v ? *v : -1;
  }
  return -1;
}

}  // namespace

int visible_rocm_devices(int physical, const std::map<std::string, std::string>& env) {
  std::optional<std::string> list = env_value(env, "CUDA_VISIBLE_DEVICES");
  const auto hip = env_value(env, "HIP_VISIBLE_DEVICES"), rocr = env_value(env, "ROCR_VISIBLE_DEVICES");
  if (rocr) {
    const int rocr_count = static_cast<int>(split(*rocr, ',').size());
    if (!hip) return std::min(rocr_count, physical);
    if (static_cast<int>(split(*hip, ',').size()) > rocr_count)
      throw std::invalid_argument("HIP_VISIBLE_DEVICES contains more devices than ROCR_VISIBLE_DEVICES");
  }
  if (hip) list = hip;
  if (!list) return physical;
  const std::vector<std::string> items = split(*list, ',');
  if (list->rfind("GPU-", 0) == 0) {  // UUIDs: each one a device, up to the first that is not one
    std::set<std::string> seen;
    int count = 0;
    for (const std::string& item : items) {
      if (!seen.insert(item).second) return 0;
      if (item.rfind("GPU-", 0) != 0) break;
      ++count;
    }
    return std::min(count, physical);
  }
  std::vector<long long> ordinals;
  for (const std::string& item : items) {
    const long long x = strtoul_prefix(trim(item));
    if (std::find(ordinals.begin(), ordinals.end(), x) != ordinals.end()) return 0;
    if (x < 0) break;
    ordinals.push_back(x);
  }
  for (size_t i = 0; i < ordinals.size(); ++i) {
    if (ordinals[i] >= physical) return static_cast<int>(i);
  }
  return static_cast<int>(ordinals.size());
}

int count_rocm_devices(const std::filesystem::path& sys, const std::filesystem::path& dev,
                       const std::map<std::string, std::string>& env) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int physical = 0;
  for (const auto& node : fs::directory_iterator(sys / "class/kfd/kfd/topology/nodes", ec)) {
    std::ifstream id_file(node.path() / "gpu_id");
    long long gpu_id = 0;
    if (!(id_file >> gpu_id) || gpu_id == 0) continue;  // a CPU node
    const long long minor = kfd_property(node.path() / "properties", "drm_render_minor");
    if (minor < 0 || !fs::exists(dev / "dri" / ("renderD" + std::to_string(minor)), ec)) continue;
    ++physical;
  }
  return physical == 0 ? 0 : visible_rocm_devices(physical, env);
}

int count_gpu_devices() {
  const int cuda = count_cuda_devices();
  if (cuda > 0) return cuda;
  std::map<std::string, std::string> env;
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}) {
    if (const char* v = std::getenv(name)) env[name] = v;
  }
  return count_rocm_devices("/sys", "/dev", env);
}

}  // namespace ddprun::launcher
