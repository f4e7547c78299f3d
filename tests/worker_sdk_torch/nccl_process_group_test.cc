// NCCL process group on the GPU of this machine (world size 1: all_reduce, broadcast, all_gather, barrier,
// abort). Without a visible CUDA device the GPU cases print "SKIPPED: no CUDA device" and only the refusal
// is checked. Built when ddprun is built with NCCL.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

#include "ddprun/backends.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"

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
