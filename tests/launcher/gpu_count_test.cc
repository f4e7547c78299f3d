// Unit tests of launcher/cuda_devices.h's AMD part: GPUs counted as torch's ROCm build counts them
// (torch.cuda.device_count(): HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES over the GPUs
// of ROCm's KFD topology), against a fake sysfs and /dev tree, and `--nproc_per_node gpu|auto` on it.
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "catch_compat.h"
#include "launcher/cuda_devices.h"
#include "launcher/launch_config.h"
#include "temp_dir.h"

using namespace ddprun::launcher;
using Env = std::map<std::string, std::string>;
namespace fs = std::filesystem;

namespace {

// A machine as the amdgpu driver shows it: KFD topology node 0 a CPU (gpu_id 0), nodes 1.. the GPUs (render
// minors 128, 129, ...); `own` of them have their /dev/dri/renderD<minor> (a container gets the host's /sys
// and only its own GPUs' device files).
struct FakeRocmMachine {
  ddprun::testing::TempDir dir;
  FakeRocmMachine(int gpus, int own) {
    node(0, 0, -1);
    for (int i = 0; i < gpus; ++i) node(i + 1, 40000 + i, 128 + i);
    fs::create_directories(dir / "dev/dri");
    for (int i = 0; i < own; ++i) std::ofstream(dir.path / "dev/dri" / ("renderD" + std::to_string(128 + i)));
    std::ofstream(dir.path / "dev/dri/card0");  // not a render node
  }
  void node(int n, long gpu_id, int minor) {
    const fs::path d = dir.path / "sys/class/kfd/kfd/topology/nodes" / std::to_string(n);
    fs::create_directories(d);
    std::ofstream(d / "gpu_id") << gpu_id << "\n";
    std::ofstream props(d / "properties");
    props << "cpu_cores_count " << (gpu_id ? 0 : 64) << "\nsimd_count " << (gpu_id ? 304 : 0) << "\n";
    if (minor >= 0) props << "drm_render_minor " << minor << "\n";
    props << "domain 0\n";
  }
  int count(const Env& env = {}) const { return count_rocm_devices(dir / "sys", dir / "dev", env); }
};

}  // namespace

TEST_CASE("ROCm: the GPUs of the KFD topology with a render node are counted, CPU nodes are not",
          "[launcher][gpu]") {
  CHECK(FakeRocmMachine(8, 8).count() == 8);
  CHECK(FakeRocmMachine(8, 2).count() == 2);  // a pod given 2 of the host's 8 GPUs
  CHECK(FakeRocmMachine(0, 0).count() == 0);  // a CPU-only KFD
  ddprun::testing::TempDir empty;             // no amdgpu driver at all
  CHECK(count_rocm_devices(empty / "sys", empty / "dev", {}) == 0);
}

TEST_CASE("ROCm: the visible devices narrow the count as torch's _parse_visible_devices does",
          "[launcher][gpu]") {
  struct Row {
    Env env;
    int expected;
  };
  auto row = GENERATE(values<Row>({
      {{}, 8},
      {{{"HIP_VISIBLE_DEVICES", "0,1"}}, 2},
      {{{"CUDA_VISIBLE_DEVICES", "3,5,7"}}, 3},
      {{{"CUDA_VISIBLE_DEVICES", "0,1"}, {"HIP_VISIBLE_DEVICES", "2"}}, 1},  // HIP wins over CUDA
      {{{"ROCR_VISIBLE_DEVICES", "0,1,2"}}, 3},                              // only its length counts
      {{{"ROCR_VISIBLE_DEVICES", "0,1,2"}, {"HIP_VISIBLE_DEVICES", "1"}}, 1},
      {{{"HIP_VISIBLE_DEVICES", ""}}, 0},
      {{{"HIP_VISIBLE_DEVICES", "-1"}}, 0},
      {{{"HIP_VISIBLE_DEVICES", "0,-1,2"}}, 1},   // a negative ordinal ends the list
      {{{"HIP_VISIBLE_DEVICES", "1gpu2,3"}}, 2},  // strtoul: "1gpu2" is 1
      {{{"HIP_VISIBLE_DEVICES", "0,1,0"}}, 0},    // a repeated ordinal: no device at all
      {{{"HIP_VISIBLE_DEVICES", "0,9,1"}}, 1},    // cut at the first ordinal past the GPUs
      {{{"HIP_VISIBLE_DEVICES", " 2 , 3 "}}, 2},
      {{{"HIP_VISIBLE_DEVICES", "GPU-aa,GPU-bb"}}, 2},
      {{{"HIP_VISIBLE_DEVICES", "GPU-aa,GPU-aa"}}, 0},
      {{{"ROCR_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7,8,9"}}, 8},
  }));
  std::string shown;
  for (const auto& [k, v] : row.env) shown += k + "='" + v + "' ";
  CAPTURE(shown);
  CHECK(visible_rocm_devices(8, row.env) == row.expected);
  CHECK(FakeRocmMachine(8, 8).count(row.env) == row.expected);
}

TEST_CASE("ROCm: more HIP_VISIBLE_DEVICES than ROCR_VISIBLE_DEVICES is refused, as torch refuses it",
          "[launcher][gpu]") {
  const Env env{{"ROCR_VISIBLE_DEVICES", "0"}, {"HIP_VISIBLE_DEVICES", "0,1"}};
  CHECK_THROWS_AS(visible_rocm_devices(8, env), std::invalid_argument);
  LaunchConfig c;
  auto r = parse_launch_config(
      {"ddprun", "--nproc_per_node", "gpu", "t.py"}, {}, [&] { return visible_rocm_devices(8, env); }, c);
  CHECK(r.exit_code == 2);
  CHECK(r.message ==
        "ddprun: --nproc_per_node=gpu: HIP_VISIBLE_DEVICES contains more devices than ROCR_VISIBLE_DEVICES");
}

TEST_CASE("ROCm: --nproc_per_node gpu and auto count the AMD GPUs", "[launcher][gpu]") {
  const FakeRocmMachine machine(4, 4);
  for (const std::string spec : {"gpu", "auto"}) {
    LaunchConfig c;
    const Env env{{"HIP_VISIBLE_DEVICES", "1,2,3"}};
    auto r = parse_launch_config(
        {"ddprun", "--nproc_per_node", spec, "t.py"}, {}, [&] { return machine.count(env); }, c);
    CAPTURE(spec, r.message);
    CHECK(r.exit_code == 0);
    CHECK(c.nproc_per_node == 3);
  }
  CHECK(count_gpu_devices() >= 0);  // this machine, whatever it has
}
