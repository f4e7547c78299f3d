#include "launcher/numa_topology.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "rendezvous/util/text_util.h"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_text(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::optional<std::set<int>> read_cpu_list(const fs::path& file) {
  auto text = read_text(file);
  return text ? parse_cpu_list(*text) : std::nullopt;
}

std::optional<int> read_int(const fs::path& file) {
  auto text = read_text(file);
  if (!text) return std::nullopt;
  auto v = parse_int(*text);
  return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
}

// The CPUs sharing `cpu_dir`'s highest-level data or unified cache (torch keeps the first index it lists at
// that level; sysfs lists index0, index1, ... and levels only grow with the index).
std::optional<std::set<int>> read_llc(const fs::path& cpu_dir) {
  std::error_code ec;
  std::map<int, fs::path> indexes;  // by number: index10 after index9
  for (const auto& e : fs::directory_iterator(cpu_dir / "cache", ec)) {
    const std::string name = e.path().filename().string();
    auto n = name.rfind("index", 0) == 0 ? parse_int(name.substr(5)) : std::nullopt;
    if (n && *n >= 0) indexes[static_cast<int>(*n)] = e.path();
  }
  int best_level = -1;
  std::optional<std::set<int>> best;
  for (const auto& [n, dir] : indexes) {
    auto type = read_text(dir / "type");
    auto level = read_int(dir / "level");
    if (!type || (*type != "Unified" && *type != "Data") || !level || *level <= best_level) continue;
    best_level = *level;
    best = read_cpu_list(dir / "shared_cpu_list");
  }
  return best;
}

std::vector<int> read_gpu_nodes(const fs::path& sys_root, const std::optional<std::string>& visible) {
  std::map<std::string, int> by_address;  // PCI address -> NUMA node
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(sys_root / "bus/pci/devices", ec)) {
    auto vendor = read_text(e.path() / "vendor");
    auto cls = read_text(e.path() / "class");
    if (vendor != "0x10de" || !cls || (cls->rfind("0x0300", 0) != 0 && cls->rfind("0x0302", 0) != 0))
      continue;
    by_address[e.path().filename().string()] = std::max(read_int(e.path() / "numa_node").value_or(0), 0);
  }
  std::vector<int> physical;
  for (const auto& [address, node] : by_address) physical.push_back(node);
  if (!visible) return physical;
  std::vector<int> out;
  std::set<long long> seen;
  for (const auto& item : split(*visible, ',')) {
    auto v = parse_int(item);
    if (!v || *v < 0 || *v >= static_cast<long long>(physical.size()) || !seen.insert(*v).second) break;
    out.push_back(physical[static_cast<size_t>(*v)]);
  }
  return out;
}

const std::set<int>& node_cpus(const NumaMachine& m, int node) {
  auto it = m.node_cpus.find(node);
  if (it == m.node_cpus.end()) {
    throw NumaBindingError("could not determine the CPUs of NUMA node " + std::to_string(node) +
                           " (devices/system/node/node" + std::to_string(node) + "/cpulist)");
  }
  return it->second;
}

std::set<int> allowed_cpus_of_node(const NumaMachine& m, int node) {
  std::set<int> out;
  for (int cpu : node_cpus(m, node)) {
    if (m.allowed_cpus.count(cpu)) out.insert(cpu);
  }
  return out;
}

// cpu -> map[cpu] (thread siblings, last-level cache); an error naming `what` when sysfs did not say.
// `what` is "<description> (<file under cpuN/>)".
const std::set<int>& cpu_group(const std::map<int, std::set<int>>& groups, int cpu, const char* what) {
  auto it = groups.find(cpu);
  if (it == groups.end() || it->second.empty()) {
    const std::string w = what;
    const auto paren = w.find(" (");
    throw NumaBindingError("no " + w.substr(0, paren) + " for CPU " + std::to_string(cpu) +
                           " (devices/system/cpu/cpu" + std::to_string(cpu) + "/" + w.substr(paren + 2));
  }
  return it->second;
}

int package_of(const NumaMachine& m, int cpu) {
  auto it = m.cpu_package.find(cpu);
  if (it == m.cpu_package.end()) {
    throw NumaBindingError("could not determine the socket of CPU " + std::to_string(cpu) +
                           " (devices/system/cpu/cpu" + std::to_string(cpu) +
                           "/topology/physical_package_id)");
  }
  return it->second;
}

// The GPUs on `node`, in index order, and where `gpu` is among them.
size_t rank_on_node(const NumaMachine& m, int gpu, int node, size_t* count) {
  size_t rank = 0;
  *count = 0;
  for (size_t g = 0; g < m.gpu_nodes.size(); ++g) {
    if (m.gpu_nodes[g] != node) continue;
    if (static_cast<int>(g) < gpu) ++rank;
    ++*count;
  }
  return rank;
}

// Allowed CPUs of `node` grouped by the lowest CPU of their group in `groups`.
std::map<int, std::set<int>> group_cpus(const NumaMachine& m, int node,
                                        const std::map<int, std::set<int>>& groups, const char* what) {
  std::map<int, std::set<int>> out;
  for (int cpu : allowed_cpus_of_node(m, node)) out[*cpu_group(groups, cpu, what).begin()].insert(cpu);
  return out;
}

std::set<int> exclusive_cpus(const NumaMachine& m, int gpu, int node) {
  size_t gpus = 0;
  const size_t rank = rank_on_node(m, gpu, node, &gpus);
  const auto cores = group_cpus(m, node, m.cpu_siblings, "thread siblings (topology/thread_siblings_list)");
  const size_t per_gpu = cores.size() / gpus, extra = cores.size() % gpus;
  if (per_gpu < 1) {
    throw NumaBindingError("there are only " + std::to_string(cores.size()) +
                           " physical cores on NUMA node " + std::to_string(node) + ", but " +
                           std::to_string(gpus) + " GPUs on it");
  }
  const size_t start = rank * per_gpu + std::min(rank, extra);
  const size_t end = start + per_gpu + (rank < extra ? 1 : 0);
  std::set<int> out;
  size_t i = 0;
  for (const auto& [first, cpus] : cores) {
    if (i >= start && i < end) out.insert(cpus.begin(), cpus.end());
    ++i;
  }
  return out;
}

std::set<int> core_complex_cpus(const NumaMachine& m, int gpu, int node) {
  size_t gpus = 0;
  const size_t rank = rank_on_node(m, gpu, node, &gpus);
  const auto by_cache = group_cpus(m, node, m.cpu_llc, "cache information (cache/index*/shared_cpu_list)");
  if (by_cache.empty()) throw NumaBindingError("NUMA node " + std::to_string(node) + " has no allowed CPU");
  std::vector<std::pair<int, std::set<int>>> ordered(by_cache.begin(), by_cache.end());
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  return ordered[rank % ordered.size()].second;
}

std::set<int> socket_cpus(const NumaMachine& m, int node) {
  auto lowest_allowed = [&](int n) -> std::optional<int> {
    auto cpus = allowed_cpus_of_node(m, n);
    return cpus.empty() ? std::nullopt : std::optional<int>(*cpus.begin());
  };
  auto own = lowest_allowed(node);
  if (!own) throw NumaBindingError("NUMA node " + std::to_string(node) + " has no allowed CPU");
  const int socket = package_of(m, *own);
  std::set<int> out;
  for (int n : m.nodes) {
    auto cpu = lowest_allowed(n);  // torch fails on a node without CPUs (memory only); ddprun skips it
    if (cpu && package_of(m, *cpu) == socket) {
      auto cpus = allowed_cpus_of_node(m, n);
      out.insert(cpus.begin(), cpus.end());
    }
  }
  return out;
}

}  // namespace

std::optional<NumaAffinity> parse_numa_affinity(std::string_view text) {
  for (auto mode :
       {NumaAffinity::kNode, NumaAffinity::kSocket, NumaAffinity::kExclusive, NumaAffinity::kCoreComplex}) {
    if (text == to_string(mode)) return mode;
  }
  return std::nullopt;
}

std::string to_string(NumaAffinity mode) {
  switch (mode) {
    case NumaAffinity::kNode:
      return "node";
    case NumaAffinity::kSocket:
      return "socket";
    case NumaAffinity::kExclusive:
      return "exclusive";
    case NumaAffinity::kCoreComplex:
      return "core-complex";
  }
  return "?";
}

NumaMachine read_numa_machine(const fs::path& sys_root,
                              const std::optional<std::string>& cuda_visible_devices,
                              std::set<int> allowed_cpus) {
  NumaMachine m;
  m.allowed_cpus = std::move(allowed_cpus);
  const fs::path node_dir = sys_root / "devices/system/node";
  m.nodes = read_cpu_list(node_dir / "possible").value_or(std::set<int>{});
  for (int node : m.nodes) {
    auto cpus = read_cpu_list(node_dir / ("node" + std::to_string(node)) / "cpulist");
    if (!cpus) continue;
    m.node_cpus[node] = *cpus;
    for (int cpu : *cpus) {
      const fs::path cpu_dir = sys_root / "devices/system/cpu" / ("cpu" + std::to_string(cpu));
      if (auto p = read_int(cpu_dir / "topology/physical_package_id")) m.cpu_package[cpu] = *p;
      if (auto s = read_cpu_list(cpu_dir / "topology/thread_siblings_list")) m.cpu_siblings[cpu] = *s;
      if (auto c = read_llc(cpu_dir)) m.cpu_llc[cpu] = *c;
    }
  }
  m.gpu_nodes = read_gpu_nodes(sys_root, cuda_visible_devices);
  return m;
}

std::set<int> current_cpu_set() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::set<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) out.insert(cpu);
  }
  return out;
}

std::set<int> cpus_for_gpu(NumaAffinity mode, int gpu_index, const NumaMachine& machine) {
  if (gpu_index < 0 || gpu_index >= static_cast<int>(machine.gpu_nodes.size())) {
    throw NumaBindingError("local rank " + std::to_string(gpu_index) + " has no GPU " +
                           std::to_string(gpu_index) + " (" + std::to_string(machine.gpu_nodes.size()) +
                           " NVIDIA GPUs visible); NUMA binding binds local rank N near GPU N");
  }
  const int node = machine.gpu_nodes[static_cast<size_t>(gpu_index)];
  std::set<int> cpus;
  switch (mode) {
    case NumaAffinity::kNode:
      cpus = allowed_cpus_of_node(machine, node);
      break;
    case NumaAffinity::kSocket:
      cpus = socket_cpus(machine, node);
      break;
    case NumaAffinity::kExclusive:
      cpus = exclusive_cpus(machine, gpu_index, node);
      break;
    case NumaAffinity::kCoreComplex:
      cpus = core_complex_cpus(machine, gpu_index, node);
      break;
  }
  if (cpus.empty()) {
    throw NumaBindingError("no CPU of this process's CPU set is near GPU " + std::to_string(gpu_index) +
                           " (NUMA node " + std::to_string(node) + ")");
  }
  return cpus;
}

std::optional<std::set<int>> parse_cpu_list(std::string_view text) {
  std::set<int> out;
  for (const auto& raw : split(text, ',')) {
    std::string item = raw;
    item.erase(0, item.find_first_not_of(" \n\t"));
    item.erase(item.find_last_not_of(" \n\t") + 1);
    if (item.empty()) continue;
    auto dash = item.find('-');
    auto first = parse_int(item.substr(0, dash));
    auto last = dash == std::string::npos ? first : parse_int(item.substr(dash + 1));
    if (!first || !last || *first < 0 || *last < *first || *last >= (1 << 20)) return std::nullopt;
    for (long long c = *first; c <= *last; ++c) out.insert(static_cast<int>(c));
  }
  return out;
}

std::string format_cpu_list(const std::set<int>& cpus) {
  std::string out;
  for (auto it = cpus.begin(); it != cpus.end();) {
    int first = *it, last = first;
    while (++it != cpus.end() && *it == last + 1) last = *it;
    if (!out.empty()) out += ',';
    out += std::to_string(first);
    if (last != first) out += "-" + std::to_string(last);
  }
  return out;
}

}  // namespace ddprun::launcher
