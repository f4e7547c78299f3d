// Unit tests of launcher/numa_topology: torch's four --numa-binding modes computed from fixture sysfs trees
// (temporary directories holding the files the kernel would show), never from this machine's /sys.
#include "launcher/numa_topology.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "catch_compat.h"

using namespace ddprun::launcher;
namespace fs = std::filesystem;

namespace {

// A sysfs tree in a temporary directory, removed at the end of the test.
class FakeSys {
 public:
  FakeSys() {
    std::string pattern = (fs::temp_directory_path() / "ddprun-sys-XXXXXX").string();
    root_ = mkdtemp(pattern.data());
  }
  ~FakeSys() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  const fs::path& root() const { return root_; }

  void write(const std::string& rel, const std::string& text) const {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text << "\n";
  }
  void node(int n, const std::string& cpulist) const {
    write("devices/system/node/node" + std::to_string(n) + "/cpulist", cpulist);
  }
  // One logical CPU: its socket, its hyperthread siblings, its L2 and L3 (L1 data and instruction too, which
  // a core-complex choice must skip).
  void cpu(int c, int package, const std::string& siblings, const std::string& l3) const {
    const std::string d = "devices/system/cpu/cpu" + std::to_string(c);
    write(d + "/topology/physical_package_id", std::to_string(package));
    write(d + "/topology/thread_siblings_list", siblings);
    cache(c, 0, "Data", 1, siblings);
    cache(c, 1, "Instruction", 1, siblings);
    cache(c, 2, "Unified", 2, siblings);
    if (!l3.empty()) cache(c, 3, "Unified", 3, l3);
  }
  void cache(int c, int index, const std::string& type, int level, const std::string& shared) const {
    const std::string d =
        "devices/system/cpu/cpu" + std::to_string(c) + "/cache/index" + std::to_string(index);
    write(d + "/type", type);
    write(d + "/level", std::to_string(level));
    write(d + "/shared_cpu_list", shared);
  }
  void pci(const std::string& address, const std::string& vendor, const std::string& cls,
           int numa_node) const {
    const std::string d = "bus/pci/devices/" + address;
    write(d + "/vendor", vendor);
    write(d + "/class", cls);
    write(d + "/numa_node", std::to_string(numa_node));
  }

 private:
  fs::path root_;
};

// Two sockets. Socket 0: node 0 (cores {0,8} {1,9} {2,10} {3,11}; L3 A = 0,1,8,9 and L3 B = 2,3,10,11) and
// node 1 (4-7,12-15, one L3). Socket 1: node 2 (16, 17, no hyperthreads). GPUs in PCI order: two on node 0,
// one on node 1, one on node 2; an Intel NIC and an NVIDIA audio function are not GPUs.
void two_sockets(const FakeSys& sys) {
  sys.write("devices/system/node/possible", "0-2");
  sys.node(0, "0-3,8-11");
  sys.node(1, "4-7,12-15");
  sys.node(2, "16-17");
  for (int c = 0; c < 4; ++c) {
    const std::string siblings = std::to_string(c) + "," + std::to_string(c + 8);
    const std::string l3 = c < 2 ? "0-1,8-9" : "2-3,10-11";
    sys.cpu(c, 0, siblings, l3);
    sys.cpu(c + 8, 0, siblings, l3);
    sys.cpu(c + 4, 0, std::to_string(c + 4) + "," + std::to_string(c + 12), "4-7,12-15");
    sys.cpu(c + 12, 0, std::to_string(c + 4) + "," + std::to_string(c + 12), "4-7,12-15");
  }
  sys.cpu(16, 1, "16", "16-17");
  sys.cpu(17, 1, "17", "16-17");
  sys.pci("0000:86:00.0", "0x10de", "0x030200", 2);
  sys.pci("0000:17:00.0", "0x10de", "0x030200", 0);
  sys.pci("0000:3b:00.0", "0x10de", "0x030000", 1);
  sys.pci("0000:18:00.0", "0x10de", "0x030200", 0);
  sys.pci("0000:18:00.1", "0x10de", "0x040300", 0);
  sys.pci("0000:19:00.0", "0x8086", "0x020000", 0);
}

std::set<int> all_cpus() {
  return *parse_cpu_list("0-17");
}

std::set<int> cpus(const std::string& list) {
  return *parse_cpu_list(list);
}

}  // namespace

TEST_CASE("cpu lists are read and written as sysfs writes them", "[numa]") {
  CHECK(parse_cpu_list("0-2,4,6-7\n") == std::set<int>{0, 1, 2, 4, 6, 7});
  CHECK(parse_cpu_list("") == std::set<int>{});
  CHECK(parse_cpu_list("5") == std::set<int>{5});
  for (const char* bad : {"a", "3-1", "-1", "1-", "0-2,x"}) {
    INFO(bad);
    CHECK_FALSE(parse_cpu_list(bad).has_value());
  }
  CHECK(format_cpu_list({0, 1, 2, 4, 6, 7}) == "0-2,4,6-7");
  CHECK(format_cpu_list({}) == "");
}

TEST_CASE("the affinity modes are spelled as torchrun spells them", "[numa]") {
  for (const char* mode : {"node", "socket", "exclusive", "core-complex"}) {
    auto parsed = parse_numa_affinity(mode);
    REQUIRE(parsed);
    CHECK(to_string(*parsed) == mode);
  }
  CHECK_FALSE(parse_numa_affinity("core_complex"));
  CHECK_FALSE(parse_numa_affinity("NODE"));
}

TEST_CASE("the machine is read from sysfs: nodes, CPUs, caches and GPUs in PCI order", "[numa]") {
  FakeSys sys;
  two_sockets(sys);
  const NumaMachine m = read_numa_machine(sys.root(), std::nullopt, all_cpus());
  CHECK(m.nodes == std::set<int>{0, 1, 2});
  CHECK(m.node_cpus.at(1) == cpus("4-7,12-15"));
  CHECK(m.cpu_package.at(16) == 1);
  CHECK(m.cpu_siblings.at(9) == cpus("1,9"));
  CHECK(m.cpu_llc.at(10) == cpus("2-3,10-11"));  // L3, not L1/L2
  CHECK(m.gpu_nodes == std::vector<int>{0, 0, 1, 2});

  SECTION("CUDA_VISIBLE_DEVICES narrows and reorders, up to its first entry that is not an index") {
    CHECK(read_numa_machine(sys.root(), "3,2", all_cpus()).gpu_nodes == std::vector<int>{2, 1});
    CHECK(read_numa_machine(sys.root(), "2,GPU-1234,0", all_cpus()).gpu_nodes == std::vector<int>{1});
    CHECK(read_numa_machine(sys.root(), "1,7,0", all_cpus()).gpu_nodes == std::vector<int>{0});
    CHECK(read_numa_machine(sys.root(), "", all_cpus()).gpu_nodes.empty());
  }
}

TEST_CASE("node binds to every allowed CPU of the GPU's NUMA node", "[numa]") {
  FakeSys sys;
  two_sockets(sys);
  const NumaMachine m = read_numa_machine(sys.root(), std::nullopt, all_cpus());
  CHECK(cpus_for_gpu(NumaAffinity::kNode, 0, m) == cpus("0-3,8-11"));
  CHECK(cpus_for_gpu(NumaAffinity::kNode, 1, m) == cpus("0-3,8-11"));
  CHECK(cpus_for_gpu(NumaAffinity::kNode, 2, m) == cpus("4-7,12-15"));
  CHECK(cpus_for_gpu(NumaAffinity::kNode, 3, m) == cpus("16-17"));
  // The agent's own CPU set bounds the choice (taskset, a Slurm cgroup).
  const NumaMachine limited = read_numa_machine(sys.root(), std::nullopt, cpus("0,1,8,16"));
  CHECK(cpus_for_gpu(NumaAffinity::kNode, 0, limited) == cpus("0-1,8"));
}

TEST_CASE("socket binds to every node of the GPU's socket", "[numa]") {
  FakeSys sys;
  two_sockets(sys);
  const NumaMachine m = read_numa_machine(sys.root(), std::nullopt, all_cpus());
  CHECK(cpus_for_gpu(NumaAffinity::kSocket, 0, m) == cpus("0-15"));
  CHECK(cpus_for_gpu(NumaAffinity::kSocket, 2, m) == cpus("0-15"));
  CHECK(cpus_for_gpu(NumaAffinity::kSocket, 3, m) == cpus("16-17"));
}

TEST_CASE("exclusive splits the node's physical cores among its GPUs", "[numa]") {
  FakeSys sys;
  two_sockets(sys);
  const NumaMachine m = read_numa_machine(sys.root(), std::nullopt, all_cpus());
  CHECK(cpus_for_gpu(NumaAffinity::kExclusive, 0, m) == cpus("0-1,8-9"));
  CHECK(cpus_for_gpu(NumaAffinity::kExclusive, 1, m) == cpus("2-3,10-11"));
  CHECK(cpus_for_gpu(NumaAffinity::kExclusive, 2, m) == cpus("4-7,12-15"));  // alone on node 1

  SECTION("a remainder gives the lower GPUs one more core") {
    sys.pci("0000:1a:00.0", "0x10de", "0x030200", 0);  // a third GPU on node 0: 4 cores = 2 + 1 + 1
    const NumaMachine three = read_numa_machine(sys.root(), std::nullopt, all_cpus());
    CHECK(cpus_for_gpu(NumaAffinity::kExclusive, 0, three) == cpus("0-1,8-9"));
    CHECK(cpus_for_gpu(NumaAffinity::kExclusive, 1, three) == cpus("2,10"));
    CHECK(cpus_for_gpu(NumaAffinity::kExclusive, 2, three) == cpus("3,11"));
  }
  SECTION("fewer cores than GPUs is an error") {
    const NumaMachine one_core = read_numa_machine(sys.root(), std::nullopt, cpus("0,8"));
    CHECK_THROWS_WITH(cpus_for_gpu(NumaAffinity::kExclusive, 0, one_core),
                      Catch::Contains("only 1 physical cores on NUMA node 0, but 2 GPUs"));
  }
}

TEST_CASE("core-complex gives each GPU of a node its own last-level cache", "[numa]") {
  FakeSys sys;
  two_sockets(sys);
  const NumaMachine m = read_numa_machine(sys.root(), std::nullopt, all_cpus());
  CHECK(cpus_for_gpu(NumaAffinity::kCoreComplex, 0, m) == cpus("0-1,8-9"));
  CHECK(cpus_for_gpu(NumaAffinity::kCoreComplex, 1, m) == cpus("2-3,10-11"));
  CHECK(cpus_for_gpu(NumaAffinity::kCoreComplex, 2, m) == cpus("4-7,12-15"));

  SECTION("the complexes with more allowed CPUs come first") {
    const NumaMachine m2 = read_numa_machine(sys.root(), std::nullopt, cpus("1-3,8-17"));
    CHECK(cpus_for_gpu(NumaAffinity::kCoreComplex, 0, m2) == cpus("2-3,10-11"));
    CHECK(cpus_for_gpu(NumaAffinity::kCoreComplex, 1, m2) == cpus("1,8-9"));
  }
  SECTION("more GPUs than complexes wrap around") {
    sys.pci("0000:1a:00.0", "0x10de", "0x030200", 0);
    const NumaMachine three = read_numa_machine(sys.root(), std::nullopt, all_cpus());
    CHECK(cpus_for_gpu(NumaAffinity::kCoreComplex, 2, three) == cpus("0-1,8-9"));
  }
}

TEST_CASE("a one-node machine: numa_node -1 is node 0; what sysfs lacks is named", "[numa]") {
  FakeSys sys;
  sys.write("devices/system/node/possible", "0");
  sys.node(0, "0-1");
  sys.write("devices/system/cpu/cpu0/topology/physical_package_id", "0");
  sys.write("devices/system/cpu/cpu1/topology/physical_package_id", "0");
  sys.pci("0000:00:04.0", "0x10de", "0x030200", -1);
  const NumaMachine m = read_numa_machine(sys.root(), std::nullopt, cpus("0-1"));
  CHECK(m.gpu_nodes == std::vector<int>{0});
  CHECK(cpus_for_gpu(NumaAffinity::kNode, 0, m) == cpus("0-1"));
  CHECK(cpus_for_gpu(NumaAffinity::kSocket, 0, m) == cpus("0-1"));
  CHECK_THROWS_WITH(cpus_for_gpu(NumaAffinity::kCoreComplex, 0, m),
                    Catch::Contains("no cache information for CPU 0"));
  CHECK_THROWS_WITH(cpus_for_gpu(NumaAffinity::kExclusive, 0, m),
                    Catch::Contains("no thread siblings for CPU 0"));
  CHECK_THROWS_AS(cpus_for_gpu(NumaAffinity::kNode, 1, m), NumaBindingError);
  CHECK_THROWS_WITH(cpus_for_gpu(NumaAffinity::kNode, 1, m),
                    Catch::Contains("local rank 1 has no GPU 1 (1 NVIDIA"));
}

TEST_CASE("no GPU at all: nothing to bind near", "[numa]") {
  FakeSys sys;
  sys.write("devices/system/node/possible", "0");
  sys.node(0, "0-1");
  const NumaMachine m = read_numa_machine(sys.root(), std::nullopt, cpus("0-1"));
  CHECK_THROWS_WITH(cpus_for_gpu(NumaAffinity::kNode, 0, m), Catch::Contains("(0 NVIDIA GPUs visible)"));
}
