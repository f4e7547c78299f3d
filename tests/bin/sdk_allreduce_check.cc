// sdk_allreduce_check: a worker program for ddprun's tests of the worker SDK. Run under ddprun (or with the
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT environment), it all-reduces known patterns of every dtype
// (float32/64, float16, bfloat16, int32/64, uint8) and op (sum, max, min exactly; avg within one rounding of
// the exact quotient, integers truncated), sizes 0 to 12 MiB, broadcasts and all-gathers, and checks every
// result. The expected values are computed here independently of the SDK's kernels.
//
//   sdk_allreduce_check [--iterations N] [--timeout-ms MS] [--large] [--kill-rank R]
//
// --large: also a 64 MiB float32 sum (every element checked).
// --kill-rank R: rank R SIGKILLs itself while all-reducing; the other ranks keep all-reducing until the
// group reports the loss, print "CollectiveError peer=<p> after <s> s: <message>" and exit 3 (SIGTERM and
// SIGINT are blocked in this mode, so that a launcher stopping the job does not cut the report short).
// Exit codes: 0 every check passed, 1 a wrong result, 2 bad usage, 3 CollectiveError, 4 other error.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/context.h"

using namespace ddprun::sdk;

namespace {

int64_t pattern(int rank, size_t i, DType t) {
  int64_t v = static_cast<int64_t>((rank * 17 + i * 5) % 19);
  return t == DType::kUInt8 ? v : v - 9;
}

// Exact conversions of small integers (|v| < 2048) to and from float16 / bfloat16 bit patterns.
uint16_t small_int_to_half(int64_t v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  uint64_t m = static_cast<uint64_t>(v < 0 ? -v : v);
  int e = 63 - __builtin_clzll(m);  // value = 1.f * 2^e
  const uint16_t frac = static_cast<uint16_t>(((m << (10 - e)) & 0x3FF));
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | frac);
}
double half_to_double(uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const double f = h & 0x3FF;
  const double mag = e == 0 ? f * std::ldexp(1.0, -24) : (1.0 + f / 1024.0) * std::ldexp(1.0, e - 15);
  return (h & 0x8000) ? -mag : mag;
}
uint16_t small_int_to_bfloat16(int64_t v) {
  float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);  // exact: small integers need at most 8 significant bits
}
double bfloat16_to_double(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Small integers fit exactly in every dtype.
double read_value(const std::byte* buf, size_t i, DType t);
void write_value(std::byte* buf, size_t i, DType t, int64_t v) {
  switch (t) {
    case DType::kFloat16:
      reinterpret_cast<uint16_t*>(buf)[i] = small_int_to_half(v);
      break;
    case DType::kBFloat16:
      reinterpret_cast<uint16_t*>(buf)[i] = small_int_to_bfloat16(v);
      break;
    case DType::kFloat32:
      reinterpret_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      reinterpret_cast<double*>(buf)[i] = static_cast<double>(v);
      break;
    case DType::kInt32:
      reinterpret_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case DType::kInt64:
      reinterpret_cast<int64_t*>(buf)[i] = v;
      break;
    case DType::kUInt8:
      reinterpret_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v);
      break;
    default:
      break;
  }
}
double read_value(const std::byte* buf, size_t i, DType t) {
  switch (t) {
    case DType::kFloat32:
      return reinterpret_cast<const float*>(buf)[i];
    case DType::kFloat64:
      return reinterpret_cast<const double*>(buf)[i];
    case DType::kInt32:
      return reinterpret_cast<const int32_t*>(buf)[i];
    case DType::kInt64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(buf)[i]);
    case DType::kUInt8:
      return reinterpret_cast<const uint8_t*>(buf)[i];
    case DType::kFloat16:
      return half_to_double(reinterpret_cast<const uint16_t*>(buf)[i]);
    case DType::kBFloat16:
      return bfloat16_to_double(reinterpret_cast<const uint16_t*>(buf)[i]);
    default:
      return 0;
  }
}

bool check_patterns(Context& ctx, int iterations, bool large) {
  auto& pg = ctx.process_group();
  const int n = ctx.world_size(), me = ctx.rank();
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                          DType::kInt32,   DType::kInt64,   DType::kUInt8};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
  for (int it = 0; it < iterations; ++it) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, size_t{300000}, size_t{1500000}}) {
      for (DType t : dtypes) {
        for (ReduceOp op : ops) {
          // The large size (12 MiB of int64: several shared-memory chunks) once per iteration.
          if (count == 1500000 && (t != DType::kInt64 || op != ReduceOp::kSum)) continue;
          // uint8 averages of wrapped sums are not a meaningful contract to check here.
          if (t == DType::kUInt8 && op == ReduceOp::kAvg) continue;
          std::vector<std::byte> buf(count * dtype_size(t));
          for (size_t i = 0; i < count; ++i) write_value(buf.data(), i, t, pattern(me, i, t));
          pg.all_reduce(buf.data(), count, t, op);
          for (size_t i = 0; i < count; ++i) {
            const bool sum_like = op == ReduceOp::kSum || op == ReduceOp::kAvg;
            int64_t want = sum_like ? 0 : pattern(0, i, t);
            for (int r = 0; r < n; ++r) {
              int64_t v = pattern(r, i, t);
              want = sum_like ? want + v : op == ReduceOp::kMax ? std::max(want, v) : std::min(want, v);
            }
            if (t == DType::kUInt8) want &= 0xFF;
            double expect = static_cast<double>(want), tolerance = 0;
            if (op == ReduceOp::kAvg) {
              const bool integer = t == DType::kInt32 || t == DType::kInt64;
              expect = integer ? static_cast<double>(want / n) : static_cast<double>(want) / n;
              // One rounding of the quotient in the element type.
              tolerance = t == DType::kFloat16    ? std::abs(expect) * 0x1p-11
                          : t == DType::kBFloat16 ? std::abs(expect) * 0x1p-8
                          : t == DType::kFloat32  ? std::abs(expect) * 0x1p-23
                                                  : std::abs(expect) * 0x1p-51;
            }
            const double got = read_value(buf.data(), i, t);
            if (std::abs(got - expect) > tolerance) {
              std::fprintf(stderr,
                           "sdk_allreduce_check: rank %d: all_reduce %s %s count %zu: element %zu is %.9g, "
                           "want %.9g\n",
                           me, dtype_name(t), reduce_op_name(op), count, i, got, expect);
              return false;
            }
          }
        }
      }
    }
    std::vector<int64_t> b(100000);
    for (int root = 0; root < n; ++root) {
      for (size_t i = 0; i < b.size(); ++i) b[i] = me == root ? static_cast<int64_t>(i) * (root + 1) : 0;
      pg.broadcast(b.data(), b.size(), DType::kInt64, root);
      for (size_t i = 0; i < b.size(); ++i) {
        if (b[i] != static_cast<int64_t>(i) * (root + 1)) {
          std::fprintf(stderr, "sdk_allreduce_check: rank %d: broadcast from %d wrong at %zu\n", me, root, i);
          return false;
        }
      }
    }
    std::vector<int32_t> in(5000, me), out(5000 * n, -1);
    pg.all_gather(in.data(), out.data(), in.size(), DType::kInt32);
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] != static_cast<int32_t>(i / 5000)) {
        std::fprintf(stderr, "sdk_allreduce_check: rank %d: all_gather wrong at %zu\n", me, i);
        return false;
      }
    }
    pg.barrier();
  }
  if (large) {
    std::vector<float> big(size_t{16} << 20);  // 64 MiB
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>((me + 1) * static_cast<int>(i % 7));
    pg.all_reduce(big.data(), big.size(), DType::kFloat32, ReduceOp::kSum);
    const int ranks_sum = n * (n + 1) / 2;
    for (size_t i = 0; i < big.size(); ++i) {
      if (big[i] != static_cast<float>(ranks_sum * static_cast<int>(i % 7))) {
        std::fprintf(stderr, "sdk_allreduce_check: rank %d: 64 MiB all_reduce wrong at %zu: %g\n", me, i,
                     static_cast<double>(big[i]));
        return false;
      }
    }
  }
  return true;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: sdk_allreduce_check [--iterations N] [--timeout-ms MS] [--large] [--kill-rank R]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2, kill_rank = -1;
  long timeout_ms = 60000;
  bool large = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--large") {
      large = true;
      continue;
    }
    if (i + 1 >= argc) usage();
    if (a == "--iterations") {
      iterations = std::atoi(argv[++i]);
    } else if (a == "--timeout-ms") {
      timeout_ms = std::atol(argv[++i]);
    } else if (a == "--kill-rank") {
      kill_rank = std::atoi(argv[++i]);
    } else {
      usage();
    }
  }
  if (kill_rank >= 0) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }
  std::unique_ptr<Context> ctx;
  try {
    ctx = init({.timeout = std::chrono::milliseconds(timeout_ms)});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdk_allreduce_check: init failed: %s\n", e.what());
    return 4;
  }
  const int me = ctx->rank();
  std::printf("sdk_allreduce_check: rank %d of %d: %s\n", me, ctx->world_size(),
              ctx->process_group().describe().c_str());
  std::fflush(stdout);
  auto start = std::chrono::steady_clock::now();
  try {
    if (kill_rank < 0) {
      if (!check_patterns(*ctx, iterations, large)) return 1;
      std::printf("sdk_allreduce_check: rank %d: all checks passed\n", me);
      return 0;
    }
    ctx->barrier();
    std::vector<float> big(size_t{4} << 20, 1.0f);
    if (me == kill_rank) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ::kill(::getpid(), SIGKILL);  // at an arbitrary point of some all_reduce
      }).detach();
    }
    for (;;) {
      start = std::chrono::steady_clock::now();
      ctx->process_group().all_reduce(big.data(), big.size(), DType::kFloat32, ReduceOp::kMax);
    }
  } catch (const CollectiveError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("sdk_allreduce_check: rank %d: CollectiveError peer=%d after %.3f s: %s\n", me, e.peer(), s,
                e.what());
    std::fflush(stdout);
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdk_allreduce_check: rank %d: %s\n", me, e.what());
    return 4;
  }
}
