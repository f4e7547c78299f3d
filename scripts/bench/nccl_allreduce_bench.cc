// ddprun-nccl-allreduce-bench: the overhead of the worker SDK's NCCL process group over raw ncclAllReduce.
// Run it under ddprun, one process per GPU (or several ranks on one GPU with --distinct-hosts):
//
//   ddprun --standalone --nproc_per_node 8 --no_python build/scripts/bench/ddprun-nccl-allreduce-bench
//   ddprun --standalone --nproc_per_node 2 --no_python ddprun-nccl-allreduce-bench --distinct-hosts
//
// Both sides get the same device buffer, float32 sum, in place, and their own communicator on device
// LOCAL_RANK (the raw one is created here with ncclCommInitRank, its ncclUniqueId exchanged through the
// agent's store). For each size (powers of 4, --min-bytes .. --max-bytes) and after --warmup calls, three
// loops of the same iteration count are timed on the host, alternating so drift hurts both alike:
//   sdk        ProcessGroup::all_reduce per iteration (blocking: returns when the collective completed)
//   raw_sync   ncclAllReduce + cudaStreamSynchronize per iteration (the same contract as sdk)
//   raw_async  ncclAllReduce per iteration, one cudaStreamSynchronize at the end (what a pipelined
//              caller gets; the lower bound)
// Rank 0 prints one JSON line per size with each loop's time per call, algbw/busbw (busbw = algbw *
// 2(n-1)/n) and overhead_pct = (sdk / raw_sync - 1) * 100. The target: <= 2 % at >= 64 MiB.
// --distinct-hosts sets NCCL_HOSTID=<rank> before NCCL starts, so several ranks can share one GPU (NCCL
// otherwise refuses "Duplicate GPU"): a test trick, the transport is then sockets over loopback.
// Exit codes: 0 done; 1 a CUDA/NCCL error or a wrong result; 2 bad flags (CLI11).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddprun/context.h"
#include "rendezvous/store/store.h"

using namespace ddprun::sdk;
using Clock = std::chrono::steady_clock;

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

// The raw communicator: the unique id goes through the agent's store under this run's own key.
ncclComm_t make_raw_comm(Context& ctx) {
  ncclUniqueId id;
  const std::string key = "nccl_bench/raw_unique_id";
  if (ctx.rank() == 0) {
    nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ctx.store()->set(key, std::string_view(reinterpret_cast<const char*>(&id), sizeof id));
  } else {
    ctx.store()->wait({key}, std::chrono::seconds(120));
    const std::string v = ctx.store()->get(key);
    if (v.size() != sizeof id) throw std::runtime_error("the raw ncclUniqueId in the store has a wrong size");
    std::memcpy(&id, v.data(), sizeof id);
  }
  ncclComm_t comm = nullptr;
  nccl_ok(ncclCommInitRank(&comm, ctx.world_size(), id, ctx.rank()), "ncclCommInitRank");
  return comm;
}

// Element-wise maximum over the ranks of a few host doubles (NCCL needs device memory: a round trip).
void max_over_ranks(ProcessGroup& pg, std::vector<double>& v) {
  void* dev = nullptr;
  const size_t bytes = v.size() * sizeof(double);
  cuda_ok(cudaMalloc(&dev, bytes), "cudaMalloc");
  cuda_ok(cudaMemcpy(dev, v.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  pg.all_reduce(dev, v.size(), DType::kFloat64, ReduceOp::kMax);
  cuda_ok(cudaMemcpy(v.data(), dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(dev);
}

template <class F>
double time_loop(int iters, F&& body) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) body();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int run(size_t min_bytes, size_t max_bytes, double min_time, int warmup, int max_iters, bool distinct_hosts) {
  if (distinct_hosts) {
    const char* rank = std::getenv("RANK");
    ::setenv("NCCL_HOSTID", ("ddprun-bench-" + std::string(rank ? rank : "0")).c_str(), 1);
  }
  InitOptions init;
  init.backend = Backend::kNccl;
  if (distinct_hosts) {  // the ranks share the GPUs there are
    int count = 0;
    cuda_ok(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    const char* local_rank = std::getenv("LOCAL_RANK");
    init.device = (local_rank ? std::atoi(local_rank) : 0) % std::max(count, 1);
  }
  auto ctx = ddprun::sdk::init(init);
  ProcessGroup& pg = ctx->process_group();
  const int n = ctx->world_size();
  if (n > 1 && ctx->store() == nullptr) throw std::runtime_error("no store: run under ddprun");
  cuda_ok(cudaSetDevice(pg.device_index()), "cudaSetDevice");
  ncclComm_t raw = n > 1 ? make_raw_comm(*ctx) : nullptr;
  if (n == 1) {
    ncclUniqueId id;
    nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    nccl_ok(ncclCommInitRank(&raw, 1, id, 0), "ncclCommInitRank");
  }
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  void* buf = nullptr;
  cuda_ok(cudaMalloc(&buf, max_bytes), "cudaMalloc");
  cuda_ok(cudaMemset(buf, 0, max_bytes), "cudaMemset");
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    auto sdk_call = [&] { pg.all_reduce(buf, count, DType::kFloat32, ReduceOp::kSum); };
    auto raw_call = [&] {
      nccl_ok(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, raw, stream), "ncclAllReduce");
    };
    auto raw_sync = [&] {
      raw_call();
      cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    };
    for (int i = 0; i < warmup; ++i) {
      sdk_call();
      raw_sync();
    }
    // The iteration count: from one timed SDK call, agreed on by all ranks (the slowest one's estimate).
    const double one = time_loop(1, sdk_call);
    std::vector<double> est{one};
    max_over_ranks(pg, est);
    int iters = static_cast<int>(min_time / std::max(est[0], 1e-6));
    iters = std::max(3, std::min(iters, max_iters));

    double t_sdk = 0, t_sync = 0, t_async = 0;
    for (int round = 0; round < 2; ++round) {  // two alternations of the three loops
      pg.barrier();
      t_sdk += time_loop(iters, sdk_call);
      pg.barrier();
      t_sync += time_loop(iters, raw_sync);
      pg.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) raw_call();
      cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      t_async += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    std::vector<double> times{t_sdk, t_sync, t_async};
    max_over_ranks(pg, times);  // the slowest rank's
    const double calls = 2.0 * iters;
    if (ctx->is_main()) {
      const double bus = n > 1 ? 2.0 * (n - 1) / n : 1.0;
      auto bw = [&](double t) { return static_cast<double>(bytes) / (t / calls) / 1e9; };
      nlohmann::json j = {{"ranks", n},
                          {"bytes", bytes},
                          {"iters", calls},
                          {"transport", pg.describe()},
                          {"sdk_us", times[0] / calls * 1e6},
                          {"raw_sync_us", times[1] / calls * 1e6},
                          {"raw_async_us", times[2] / calls * 1e6},
                          {"sdk_busbw_GBps", bw(times[0]) * bus},
                          {"raw_sync_busbw_GBps", bw(times[1]) * bus},
                          {"raw_async_busbw_GBps", bw(times[2]) * bus},
                          {"overhead_pct", (times[0] / times[1] - 1.0) * 100.0}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  cudaFree(buf);
  cudaStreamDestroy(stream);
  ncclCommDestroy(raw);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"worker SDK NCCL all-reduce against raw ncclAllReduce"};
  size_t min_bytes = 4096, max_bytes = size_t{1} << 30;
  double min_time = 0.5;
  int warmup = 5, max_iters = 5000;
  bool distinct_hosts = false;
  app.add_option("--min-bytes", min_bytes, "smallest size in bytes")->check(CLI::PositiveNumber);
  app.add_option("--max-bytes", max_bytes, "largest size in bytes")->check(CLI::PositiveNumber);
  app.add_option("--min-time", min_time, "seconds per loop and size (at least 3 iterations)");
  app.add_option("--warmup", warmup, "untimed calls per size and side");
  app.add_option("--max-iters", max_iters, "iterations per loop at most")->check(CLI::PositiveNumber);
  app.add_flag("--distinct-hosts", distinct_hosts, "NCCL_HOSTID per rank: several ranks on one GPU (tests)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(min_bytes, max_bytes, min_time, warmup, max_iters, distinct_hosts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun-nccl-allreduce-bench: %s\n", e.what());
    return 1;
  }
}
