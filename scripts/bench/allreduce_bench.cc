// ddprun-allreduce-bench: all-reduce bandwidth of the worker SDK's process group, nccl-tests style.
// Run it under ddprun (one process per rank):
//
//   ddprun --standalone --nproc_per_node 4 --no_python build/scripts/bench/ddprun-allreduce-bench
//
// For each size (bytes, powers of 4 from --min-bytes to --max-bytes) it all-reduces a float32 buffer (sum)
// for warm-up, then times enough iterations to last about --min-time seconds (the same count on every
// rank). The time of a size is the slowest rank's. Rank 0 prints one JSON line per size:
//   {"impl":"ddprun","transport":"cpu: shm(4)","ranks":4,"bytes":...,"iters":...,"time_us":...,
//    "algbw_GBps":...,"busbw_GBps":...}
// algbw = bytes / time; busbw = algbw * 2(n-1)/n (the bytes each rank must move in a ring, as in nccl-tests).
// cpu_ms: CPU time (user + system) of all ranks together per all-reduce: the cost, which a loaded machine
// disturbs less than the wall-clock time.
// --check verifies the result of the last iteration of each size (exits 1 on a mismatch).
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "ddprun/context.h"

using namespace ddprun::sdk;
using Clock = std::chrono::steady_clock;

namespace {
double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"all-reduce bandwidth of the ddprun worker SDK"};
  size_t min_bytes = 4096, max_bytes = size_t{256} << 20;
  double min_time = 1.0;
  int warmup = 2, max_iters = 2000;
  bool check = false;
  app.add_option("--min-bytes", min_bytes, "smallest size in bytes");
  app.add_option("--max-bytes", max_bytes, "largest size in bytes");
  app.add_option("--min-time", min_time, "seconds to time per size (at least 3 iterations)");
  app.add_option("--warmup", warmup, "untimed iterations per size");
  app.add_option("--max-iters", max_iters, "iterations per size at most");
  app.add_flag("--check", check, "verify the results");
  CLI11_PARSE(app, argc, argv);

  auto ctx = init();
  auto& pg = ctx->process_group();
  const int n = ctx->world_size();
  std::vector<float> buf(max_bytes / sizeof(float));

  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    std::fill(buf.begin(), buf.begin() + count, 0.0f);  // zeros: sums stay finite however many iterations
    auto t0 = Clock::now();
    for (int i = 0; i < warmup; ++i) pg.all_reduce(buf.data(), count, DType::kFloat32, ReduceOp::kSum);
    double per_iter = std::chrono::duration<double>(Clock::now() - t0).count() / std::max(warmup, 1);
    // Every rank must run the same number of iterations: agree on the largest estimate.
    int64_t iters =
        std::clamp<int64_t>(static_cast<int64_t>(min_time / std::max(per_iter, 1e-7)), 3, max_iters);
    pg.all_reduce(&iters, 1, DType::kInt64, ReduceOp::kMax);

    pg.barrier();
    t0 = Clock::now();
    double cpu0 = cpu_seconds();
    for (int64_t i = 0; i < iters; ++i) pg.all_reduce(buf.data(), count, DType::kFloat32, ReduceOp::kSum);
    double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    double cpu = cpu_seconds() - cpu0;
    pg.all_reduce(&elapsed, 1, DType::kFloat64, ReduceOp::kMax);
    pg.all_reduce(&cpu, 1, DType::kFloat64, ReduceOp::kSum);

    if (check) {
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(ctx->rank() + i % 7);
      pg.all_reduce(buf.data(), count, DType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        float want = static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 7));
        if (buf[i] != want) {
          std::fprintf(stderr, "rank %d: wrong result at %zu of %zu bytes: %g, want %g\n", ctx->rank(), i,
                       bytes, buf[i], want);
          return 1;
        }
      }
    }
    if (ctx->is_main()) {
      const double t = elapsed / static_cast<double>(iters);
      const double algbw = static_cast<double>(bytes) / t / 1e9;
      nlohmann::json j = {{"impl", "ddprun"},
                          {"transport", pg.describe()},
                          {"ranks", n},
                          {"bytes", bytes},
                          {"iters", iters},
                          {"time_us", t * 1e6},
                          {"cpu_ms", cpu / static_cast<double>(iters) * 1e3},
                          {"algbw_GBps", algbw},
                          {"busbw_GBps", algbw * 2.0 * (n - 1) / n}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
