// NCCL process group on the GPU of this machine (world size 1: all_reduce, broadcast, all_gather, barrier,
// abort), and two ranks on that one GPU as two processes, each with its own NCCL_HOSTID so that NCCL takes
// them for separate hosts (socket transport, NCCL_SOCKET_IFNAME=lo; NCCL refuses two ranks of one host on one
// GPU): all_reduce sum/avg of float32 and bfloat16, broadcast, all_gather, and a SIGKILLed peer that makes
// the survivor's collective throw CollectiveError (within the group's timeout). The two ranks are this test
// binary itself, re-executed with the hidden test case [nccl_pair_rank] and DDPRUN_NCCL_PAIR_* variables
// (fork without exec is not an option: the parent has initialised CUDA).
// Without a visible CUDA device the GPU cases print "SKIPPED: no CUDA device" and only the refusal
// is checked. Built when ddprun is built with NCCL.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "child_processes.h"
#include "ddprun/backends.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"

using namespace ddprun;
using namespace ddprun::sdk;
using namespace std::chrono_literals;

namespace {

bool skip_without_gpu() {
  if (nccl_available()) return false;
  std::puts("SKIPPED: no CUDA device");
  WARN("SKIPPED: no CUDA device");
  return true;
}

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) { REQUIRE(cudaMalloc(&ptr, bytes) == cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  void* ptr = nullptr;
};

template <class T>
void upload(DeviceBuffer& b, const std::vector<T>& v) {
  REQUIRE(cudaMemcpy(b.ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
}
template <class T>
std::vector<T> download(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  REQUIRE(cudaMemcpy(v.data(), b.ptr, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return v;
}

}  // namespace

TEST_CASE("without a CUDA device the NCCL backend refuses with a clear message", "[nccl]") {
  if (nccl_available()) {
    std::puts("SKIPPED: a CUDA device is visible (this case checks the refusal without one)");
    return;
  }
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  rdzv::StoreClient store("127.0.0.1", server.port(), {.connect_timeout = 10s, .timeout = 10s});
  CHECK_THROWS_WITH(make_nccl_process_group(store, "nccl", 0, 1, 0),
                    Catch::Contains("no CUDA device visible"));
}

TEST_CASE("NCCL collectives on one GPU", "[nccl][gpu]") {
  if (skip_without_gpu()) return;
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  rdzv::StoreClient store("127.0.0.1", server.port(), {.connect_timeout = 10s, .timeout = 30s});
  ProcessGroupOptions o;
  o.timeout = 60s;
  auto pg = make_nccl_process_group(store, "nccl", 0, 1, 0, o);
  CHECK(std::string(pg->backend()) == "nccl");

  DeviceBuffer a(1024 * sizeof(float));
  std::vector<float> v(1024);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  upload(a, v);
  pg->all_reduce(a.ptr, v.size(), DType::kFloat32, ReduceOp::kAvg);
  CHECK(download<float>(a, v.size()) == v);
  pg->broadcast(a.ptr, v.size(), DType::kFloat32, 0);
  CHECK(download<float>(a, v.size()) == v);
  DeviceBuffer out(1024 * sizeof(float));
  pg->all_gather(a.ptr, out.ptr, v.size(), DType::kFloat32);
  CHECK(download<float>(out, v.size()) == v);
  pg->barrier();
  CHECK_THROWS_AS(pg->broadcast(a.ptr, 1, DType::kFloat32, 1), std::invalid_argument);

  pg->abort();
  CHECK_THROWS_AS(pg->all_reduce(a.ptr, v.size(), DType::kFloat32, ReduceOp::kSum), CollectiveError);
}

namespace {

// bfloat16 <-> float for values exactly representable in bfloat16 (small integers and halves).
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

const char* env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

using ddprun::testing::Child;

// Starts this binary running only the hidden rank test case, with `extra_env` added.
Child spawn_rank(const std::vector<std::string>& extra_env) {
  char self[PATH_MAX];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(len > 0);
  self[len] = '\0';
  return ddprun::testing::spawn_child({self, "[nccl_pair_rank]"}, extra_env);
}

}  // namespace

TEST_CASE("NCCL between two processes on one GPU with a distinct NCCL_HOSTID each", "[nccl][gpu]") {
  if (skip_without_gpu()) return;
  const std::string mode = GENERATE("collectives", "kill");
  CAPTURE(mode);
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  std::vector<Child> children;
  for (int r = 0; r < 2; ++r) {
    children.push_back(
        spawn_rank({"DDPRUN_NCCL_PAIR_RANK=" + std::to_string(r),
                    "DDPRUN_NCCL_PAIR_PORT=" + std::to_string(server.port()), "DDPRUN_NCCL_PAIR_MODE=" + mode,
                    "NCCL_HOSTID=ddprun-nccl-pair-test-host-" + std::to_string(r),
                    "NCCL_SOCKET_IFNAME=lo"}));  // bootstrap and data over loopback only
  }
  ddprun::testing::wait_children(children, std::chrono::seconds(240));
  for (int r = 0; r < 2; ++r)
    std::printf("--- rank %d (exit %d) ---\n%s", r, children[r].exit_code, children[r].output.c_str());
  INFO("rank 0 output:\n" << children[0].output << "\nrank 1 output:\n" << children[1].output);
  CHECK(children[0].exit_code == 0);
  CHECK_THAT(children[0].output, Catch::Contains("nccl pair rank 0: " + mode + " ok"));
  if (mode == "collectives") {
    CHECK(children[1].exit_code == 0);
    CHECK_THAT(children[1].output, Catch::Contains("nccl pair rank 1: collectives ok"));
  } else {
    CHECK(children[1].exit_code == 128 + SIGKILL);
    CHECK_THAT(children[0].output, Catch::Contains("CollectiveError after"));
  }
}

// One rank of the test above, run in a child process; skipped unless DDPRUN_NCCL_PAIR_RANK is set.
TEST_CASE("NCCL pair: one rank (internal: started by the two-process test)", "[.][nccl_pair_rank]") {
  const std::string rank_env = env_or_empty("DDPRUN_NCCL_PAIR_RANK");
  if (rank_env.empty()) return;
  const int rank = std::atoi(rank_env.c_str());
  const int port = std::atoi(env_or_empty("DDPRUN_NCCL_PAIR_PORT"));
  const std::string mode = env_or_empty("DDPRUN_NCCL_PAIR_MODE");
  std::printf("nccl pair rank %d: NCCL_HOSTID=%s, mode %s\n", rank, env_or_empty("NCCL_HOSTID"),
              mode.c_str());
  std::fflush(stdout);
  rdzv::StoreClient store("127.0.0.1", static_cast<uint16_t>(port), {.connect_timeout = 10s, .timeout = 60s});
  ProcessGroupOptions o;
  o.timeout = mode == "kill" ? 20s : 60s;
  auto pg = make_nccl_process_group(store, "nccl_pair_" + mode, rank, 2, 0, o);
  REQUIRE(pg->size() == 2);

  if (mode == "kill") {
    pg->barrier();
    if (rank == 1) ::kill(::getpid(), SIGKILL);  // the peer dies between collectives
    DeviceBuffer a(size_t{1} << 22);
    const auto start = std::chrono::steady_clock::now();
    bool caught = false;
    try {
      // Bounded: every call ends within the timeout, and the first one cannot complete without rank 1.
      for (int i = 0; i < 1000; ++i) pg->all_reduce(a.ptr, size_t{1} << 20, DType::kFloat32, ReduceOp::kSum);
    } catch (const CollectiveError& e) {
      caught = true;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("nccl pair rank %d: CollectiveError after %.2f s (timeout %lld s), peer %d: %s\n", rank, s,
                  static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(o.timeout).count()),
                  e.peer(), e.what());
    }
    REQUIRE(caught);
    // The group is broken: later calls throw at once.
    CHECK_THROWS_AS(pg->all_reduce(a.ptr, 16, DType::kFloat32, ReduceOp::kSum), CollectiveError);
    std::printf("nccl pair rank %d: kill ok\n", rank);
    std::fflush(stdout);
    return;
  }

  // all_reduce sum and avg, float32 (several MiB) and bfloat16; every value exact in its type.
  const size_t n32 = size_t{1} << 20, n16 = 4096;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    CAPTURE(reduce_op_name(op));
    const float factor = op == ReduceOp::kSum ? 3.0f : 1.5f;  // (1 + 2) or (1 + 2) / 2
    std::vector<float> v(n32);
    for (size_t i = 0; i < n32; ++i) v[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 1024));
    DeviceBuffer a(n32 * sizeof(float));
    upload(a, v);
    pg->all_reduce(a.ptr, n32, DType::kFloat32, op);
    const auto got = download<float>(a, n32);
    size_t wrong = 0;
    for (size_t i = 0; i < n32; ++i) wrong += got[i] != factor * static_cast<float>(i % 1024);
    CHECK(wrong == 0);

    std::vector<uint16_t> h(n16);
    for (size_t i = 0; i < n16; ++i)
      h[i] = to_bf16(static_cast<float>((rank + 1) * static_cast<int>(i % 64)));
    DeviceBuffer b(n16 * sizeof(uint16_t));
    upload(b, h);
    pg->all_reduce(b.ptr, n16, DType::kBFloat16, op);
    const auto got16 = download<uint16_t>(b, n16);
    wrong = 0;
    for (size_t i = 0; i < n16; ++i) wrong += from_bf16(got16[i]) != factor * static_cast<float>(i % 64);
    CHECK(wrong == 0);
  }

  // broadcast from each root.
  for (int root = 0; root < 2; ++root) {
    std::vector<int64_t> v(100000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = rank == root ? static_cast<int64_t>(i) * (root + 7) : -1;
    DeviceBuffer a(v.size() * sizeof(int64_t));
    upload(a, v);
    pg->broadcast(a.ptr, v.size(), DType::kInt64, root);
    const auto got = download<int64_t>(a, v.size());
    size_t wrong = 0;
    for (size_t i = 0; i < v.size(); ++i) wrong += got[i] != static_cast<int64_t>(i) * (root + 7);
    CHECK(wrong == 0);
  }

  // all_gather: row r is rank r's input.
  const size_t count = 5000;
  std::vector<float> in(count);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank * 10000 + static_cast<int>(i));
  DeviceBuffer a(count * sizeof(float)), out(2 * count * sizeof(float));
  upload(a, in);
  pg->all_gather(a.ptr, out.ptr, count, DType::kFloat32);
  const auto got = download<float>(out, 2 * count);
  size_t wrong = 0;
  for (size_t i = 0; i < 2 * count; ++i)
    wrong += got[i] != static_cast<float>(static_cast<int>(i / count) * 10000 + static_cast<int>(i % count));
  CHECK(wrong == 0);
  pg->barrier();
  std::printf("nccl pair rank %d: collectives ok\n", rank);
  std::fflush(stdout);
}
