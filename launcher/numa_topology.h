// NUMA binding (--numa-binding, as torch.numa.binding does it): the CPUs each worker is bound to, chosen from
// the machine's topology in sysfs and the NUMA node of the GPU whose index is the worker's local rank.
//
// read_numa_machine() reads what the choice needs from a sysfs tree (/sys, or a test's temporary copy);
// cpus_for_gpu() is pure. torch's modes (torch/numa/binding.py), for GPU g on NUMA node n:
//   node          every allowed CPU of node n;
//   socket        every allowed CPU of the nodes whose lowest allowed CPU is on the same package (socket) as
//                 node n's lowest allowed CPU;
//   exclusive     node n's physical cores (logical CPUs grouped by thread_siblings_list), sorted by their
//                 lowest CPU, split evenly among the GPUs of node n in index order, the first ones getting
//                 one more core when the division has a remainder; fewer cores than GPUs is an error;
//   core-complex  node n's allowed CPUs grouped by their highest-level data or unified cache
//                 (cache/index*/shared_cpu_list), the groups ordered by size (largest first), then by lowest
//                 CPU; the i-th GPU of node n (in index order) gets group i modulo the number of groups.
// "Allowed" CPUs are those of the agent's own CPU set (sched_getaffinity). A GPU whose PCI numa_node is -1
// (one-node machines) counts as on node 0.
//
// Errors: cpus_for_gpu throws NumaBindingError with a message saying what is missing (no GPU at that index,
// no CPU information for a node or CPU, an empty CPU set). read_numa_machine never throws except
// std::bad_alloc: what it cannot read is left out, and cpus_for_gpu reports it when a mode needs it.
// Thread-safe (no shared state).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// torch's AffinityMode, spelled as on its command line.
enum class NumaAffinity { kNode, kSocket, kExclusive, kCoreComplex };

// "node", "socket", "exclusive", "core-complex"; nullopt for anything else.
std::optional<NumaAffinity> parse_numa_affinity(std::string_view text);
std::string to_string(NumaAffinity mode);

struct NumaBindingError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the choice of CPUs reads from sysfs.
struct NumaMachine {
  std::set<int> nodes;                        // devices/system/node/possible
  std::map<int, std::set<int>> node_cpus;     // node -> node<N>/cpulist
  std::map<int, int> cpu_package;             // cpu -> cpu<N>/topology/physical_package_id
  std::map<int, std::set<int>> cpu_siblings;  // cpu -> cpu<N>/topology/thread_siblings_list
  std::map<int, std::set<int>> cpu_llc;       // cpu -> CPUs sharing its highest-level data/unified cache
  std::vector<int> gpu_nodes;                 // NUMA node of each CUDA device, index = device number
  std::set<int> allowed_cpus;                 // the agent's CPU set
};

// Reads `sys_root` (normally "/sys"). GPUs: the NVIDIA display/3D controllers of bus/pci/devices (vendor
// 0x10de, class 0x0300xx or 0x0302xx) in PCI address order, which is how CUDA numbers identical GPUs,
// narrowed by `cuda_visible_devices` (nullopt = unset) as the CUDA runtime reads it: numeric indices up to
// the first entry that is not one (GPU-/MIG- UUIDs cannot be mapped from sysfs and end the list too).
NumaMachine read_numa_machine(const std::filesystem::path& sys_root,
                              const std::optional<std::string>& cuda_visible_devices,
                              std::set<int> allowed_cpus);

// This process's CPU set (sched_getaffinity); empty if it cannot be read.
std::set<int> current_cpu_set();

// The CPUs a worker using GPU `gpu_index` is bound to in `mode` (see the top of this file). Never empty.
std::set<int> cpus_for_gpu(NumaAffinity mode, int gpu_index, const NumaMachine& machine);

// sysfs lists: "0-2,4,6-7\n" -> {0,1,2,4,6,7}; "" -> {}; nullopt when malformed.
std::optional<std::set<int>> parse_cpu_list(std::string_view text);
// The reverse, compact: {0,1,2,4,6,7} -> "0-2,4,6-7".
std::string format_cpu_list(const std::set<int>& cpus);

}  // namespace ddprun::launcher
