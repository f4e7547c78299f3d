// CPU process group, every rank a thread of this process, through a real store server on 127.0.0.1:
// all_reduce over a grid of world sizes x transports x dtypes x ops x sizes with exact expected results,
// broadcast, all_gather, barrier, timeouts and abort.
//
// Catch2 assertions are not thread-safe: rank threads only record failures; the test thread asserts.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <latch>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.h"
#include "ddprun/backends.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"
#include "worker_sdk/src/reduce_kernels.h"

using namespace ddprun;
using namespace ddprun::sdk;
using namespace std::chrono_literals;

namespace {

enum class Mode { kShm, kTcp, kHier };
const char* mode_name(Mode m) {
  return m == Mode::kShm ? "shm" : m == Mode::kTcp ? "tcp" : "hierarchical";
}

ProcessGroupOptions options_for(Mode m, int rank, std::chrono::milliseconds timeout = 60s) {
  ProcessGroupOptions o;
  o.timeout = timeout;
  o.advertise_address = "127.0.0.1";
  if (m == Mode::kTcp) o.cpu_transport = CpuTransport::kTcp;
  if (m == Mode::kHier) o.host_id = "fake-host-" + std::to_string(rank % 2);  // two hosts, interleaved ranks
  if (m == Mode::kShm) o.shm_slot_bytes = 64 << 10;                           // many chunks per call
  o.tcp_segment_bytes = 16 << 10;
  return o;
}

// Runs body(rank, group) on `n` threads, each with its own store client and group. Returns the failures
// the bodies recorded (or threw), one string each.
struct Failures {
  std::mutex mu;
  std::vector<std::string> list;
  void add(std::string s) {
    std::lock_guard lock(mu);
    if (list.size() < 20) list.push_back(std::move(s));
  }
};

void run_group(int n, const std::function<ProcessGroupOptions(int)>& opts,
               const std::function<void(int, ProcessGroup&, Failures&)>& body, Failures& failures) {
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  static std::atomic<int> group_serial{0};
  const std::string prefix = "pg" + std::to_string(group_serial++);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        rdzv::StoreClient store("127.0.0.1", server.port(), {.connect_timeout = 10s, .timeout = 60s});
        auto pg = make_cpu_process_group(store, prefix, r, n, opts(r));
        body(r, *pg, failures);
      } catch (const std::exception& e) {
        failures.add("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Small integers: every sum over <= 8 ranks is exact in every dtype (uint8 included). Period kPeriod in i.
constexpr size_t kPeriod = 23;
int64_t pattern(int rank, size_t i, DType t) {
  int64_t v = static_cast<int64_t>((rank * 31 + i * 7) % 23);
  return t == DType::kUInt8 ? v : v - 11;
}

void store_value(void* buf, size_t i, DType t, double v) {
  switch (t) {
    case DType::kFloat32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      static_cast<double*>(buf)[i] = v;
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(buf)[i] = float_to_half(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = float_to_bfloat16(static_cast<float>(v));
      break;
    case DType::kInt32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case DType::kInt64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case DType::kUInt8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v);
      break;
  }
}

// The exact value every path must produce (see reduce_kernels.h for the avg rounding).
void expected_value(void* buf, size_t i, DType t, ReduceOp op, int n) {
  int64_t sum = 0, hi = pattern(0, i, t), lo = hi;
  for (int r = 0; r < n; ++r) {
    int64_t v = pattern(r, i, t);
    sum += v;
    hi = std::max(hi, v);
    lo = std::min(lo, v);
  }
  if (op == ReduceOp::kMax) return store_value(buf, i, t, static_cast<double>(hi));
  if (op == ReduceOp::kMin) return store_value(buf, i, t, static_cast<double>(lo));
  if (op == ReduceOp::kSum) return store_value(buf, i, t, static_cast<double>(sum));
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      return store_value(buf, i, t, static_cast<double>(static_cast<float>(sum) / static_cast<float>(n)));
    case DType::kFloat64:
      return store_value(buf, i, t, static_cast<double>(sum) / n);
    default:
      return store_value(buf, i, t, static_cast<double>(sum / n));
  }
}

const DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                         DType::kInt32,   DType::kInt64,   DType::kUInt8};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

// All-reduces pattern data and compares with the expected bytes; records the first mismatch.
void check_all_reduce(int rank, int n, ProcessGroup& pg, size_t count, DType t, ReduceOp op, Failures& f) {
  // pattern() has period 23 in i: build one period of input and of expected values, then tile them.
  const size_t es = dtype_size(t);
  std::vector<std::byte> in_period(kPeriod * es), want_period(kPeriod * es);
  for (size_t i = 0; i < kPeriod; ++i) {
    store_value(in_period.data(), i, t, static_cast<double>(pattern(rank, i, t)));
    expected_value(want_period.data(), i, t, op, n);
  }
  std::vector<std::byte> buf(count * es + 1), want(count * es + 1);
  for (size_t i = 0; i < count; i += kPeriod) {
    const size_t m = std::min(kPeriod, count - i) * es;
    std::memcpy(buf.data() + i * es, in_period.data(), m);
    std::memcpy(want.data() + i * es, want_period.data(), m);
  }
  pg.all_reduce(buf.data(), count, t, op);
  if (std::memcmp(buf.data(), want.data(), count * es) != 0) {
    size_t i = 0;
    while (std::memcmp(buf.data() + i * es, want.data() + i * es, es) == 0) ++i;
    f.add("rank " + std::to_string(rank) + ": all_reduce " + dtype_name(t) + " " + reduce_op_name(op) +
          " count " + std::to_string(count) + ": first mismatch at element " + std::to_string(i) + " (" +
          pg.describe() + ")");
  }
}

}  // namespace

TEST_CASE("all_reduce grid: world sizes x transports x dtypes x ops x sizes", "[cpu_pg][grid]") {
  const int n = GENERATE(1, 2, 3, 4, 5, 6, 7, 8);
  const Mode mode = GENERATE(Mode::kShm, Mode::kTcp, Mode::kHier);
  if (mode == Mode::kHier && n < 3) return;  // needs two hosts with several ranks on one
  CAPTURE(n, mode_name(mode));
  Failures f;
  std::vector<std::string> described(n);
  run_group(
      n, [&](int r) { return options_for(mode, r); },
      [&](int rank, ProcessGroup& pg, Failures& fail) {
        described[rank] = pg.describe();
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}}) {
          for (DType t : kDTypes) {
            for (ReduceOp op : kOps) check_all_reduce(rank, n, pg, count, t, op, fail);
          }
        }
        // 1 Mi elements: every dtype and op on the larger worlds of each transport, sum elsewhere.
        const bool full = n == 3 || n == 8;
        for (DType t : kDTypes) {
          for (ReduceOp op : kOps) {
            if (full || op == ReduceOp::kSum) check_all_reduce(rank, n, pg, size_t{1} << 20, t, op, fail);
          }
        }
      },
      f);
  INFO(described[0]);
  for (const auto& s : f.list) FAIL_CHECK(s);
  if (n > 1) {
    const std::string want = mode == Mode::kShm ? "shm(" : mode == Mode::kTcp ? "tcp-ring(" : "x tcp-ring";
    CHECK_THAT(described[0], Catch::Contains(want));
  }
}

TEST_CASE("all_reduce of 64 MiB over shared memory", "[cpu_pg][large]") {
  const int n = 4;
  const size_t count = size_t{16} << 20;  // float32: 64 MiB per rank, 16 chunks of the default 4 MiB slot
  Failures f;
  run_group(
      n, [&](int) { return ProcessGroupOptions{}; },
      [&](int rank, ProcessGroup& pg, Failures& fail) {
        check_all_reduce(rank, n, pg, count, DType::kFloat32, ReduceOp::kSum, fail);
      },
      f);
  for (const auto& s : f.list) FAIL_CHECK(s);
}

TEST_CASE("all_reduce of random floats agrees with a double-precision sum", "[cpu_pg]") {
  const int n = 5;
  const Mode mode = GENERATE(Mode::kShm, Mode::kTcp, Mode::kHier);
  CAPTURE(mode_name(mode));
  const size_t count = 100003;
  auto data_of = [&](int rank) {
    std::mt19937 gen(1234 + rank);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(count);
    for (auto& x : v) x = dist(gen);
    return v;
  };
  std::vector<double> want(count, 0.0);
  for (int r = 0; r < n; ++r) {
    auto v = data_of(r);
    for (size_t i = 0; i < count; ++i) want[i] += v[i];
  }
  std::vector<std::vector<float>> got(n);
  Failures f;
  run_group(
      n, [&](int r) { return options_for(mode, r); },
      [&](int rank, ProcessGroup& pg, Failures&) {
        got[rank] = data_of(rank);
        pg.all_reduce(got[rank].data(), count, DType::kFloat32, ReduceOp::kAvg);
      },
      f);
  for (const auto& s : f.list) FAIL(s);
  double worst = 0;
  for (size_t i = 0; i < count; ++i) worst = std::max(worst, std::abs(got[0][i] - want[i] / n));
  CHECK(worst < 1e-6);
  for (int r = 1; r < n; ++r) CHECK(std::memcmp(got[r].data(), got[0].data(), count * sizeof(float)) == 0);
}

TEST_CASE("broadcast, all_gather and barrier", "[cpu_pg]") {
  const int n = GENERATE(1, 2, 3, 5, 8);
  const Mode mode = GENERATE(Mode::kShm, Mode::kTcp, Mode::kHier);
  if (mode == Mode::kHier && n < 3) return;
  CAPTURE(n, mode_name(mode));
  std::atomic<int> arrived{0};
  Failures f;
  run_group(
      n, [&](int r) { return options_for(mode, r); },
      [&](int rank, ProcessGroup& pg, Failures& fail) {
        auto tag = [&](const std::string& what) { return "rank " + std::to_string(rank) + ": " + what; };
        for (size_t count : {size_t{0}, size_t{1}, size_t{4097}, size_t{300001}}) {
          for (int root : {0, n / 2, n - 1}) {
            std::vector<int32_t> buf(count);
            for (size_t i = 0; i < count; ++i)
              buf[i] = rank == root ? static_cast<int32_t>(i * 3 + root) : -1;
            pg.broadcast(buf.data(), count, DType::kInt32, root);
            for (size_t i = 0; i < count; ++i) {
              if (buf[i] != static_cast<int32_t>(i * 3 + root)) {
                fail.add(tag("broadcast from " + std::to_string(root) + " count " + std::to_string(count) +
                             " wrong at " + std::to_string(i)));
                break;
              }
            }
          }
          std::vector<double> in(count), out(count * n, -1.0);
          for (size_t i = 0; i < count; ++i) in[i] = rank * 1e6 + static_cast<double>(i);
          pg.all_gather(in.data(), out.data(), count, DType::kFloat64);
          for (int r = 0; r < n; ++r) {
            for (size_t i = 0; i < count; ++i) {
              if (out[r * count + i] != r * 1e6 + static_cast<double>(i)) {
                fail.add(tag("all_gather count " + std::to_string(count) + " wrong in block " +
                             std::to_string(r)));
                r = n;
                break;
              }
            }
          }
        }
        for (int round = 1; round <= 5; ++round) {
          arrived.fetch_add(1);
          pg.barrier();
          if (arrived.load() < round * n) fail.add(tag("left barrier " + std::to_string(round) + " early"));
          pg.barrier();  // nobody starts the next round before everyone has checked this one
        }
      },
      f);
  for (const auto& s : f.list) FAIL_CHECK(s);
}

TEST_CASE("a rank that never calls: the others get CollectiveError naming it", "[cpu_pg][timeout]") {
  const int n = 4, silent = 2;
  const Mode mode = GENERATE(Mode::kShm, Mode::kTcp, Mode::kHier);
  CAPTURE(mode_name(mode));
  const auto timeout = 500ms;
  std::latch others_done(n - 1);
  std::vector<int> peer(n, -100);
  std::vector<std::string> message(n);
  Failures f;
  run_group(
      n, [&](int r) { return options_for(mode, r, timeout); },
      [&](int rank, ProcessGroup& pg, Failures& fail) {
        if (rank == silent) {
          others_done.wait();  // keep the group (and its sockets) alive until the others gave up
          return;
        }
        std::vector<float> buf(1000, 1.0f);
        try {
          pg.all_reduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
          fail.add("rank " + std::to_string(rank) + ": all_reduce returned without rank " +
                   std::to_string(silent));
        } catch (const CollectiveError& e) {
          peer[rank] = e.peer();
          message[rank] = e.what();
        }
        // The group is broken now: later calls fail at once.
        try {
          pg.barrier();
          fail.add("rank " + std::to_string(rank) + ": barrier after the failure returned");
        } catch (const CollectiveError&) {
        }
        others_done.count_down();
      },
      f);
  for (const auto& s : f.list) FAIL_CHECK(s);
  for (int r = 0; r < n; ++r) {
    if (r == silent) continue;
    INFO("rank " << r << ": " << message[r]);
    CHECK(peer[r] != -100);
    CHECK_THAT(message[r], Catch::Contains("all_reduce(float32 x 1000)"));
  }
  // Who can tell: in shared memory everyone; in the ring the silent rank's successor; hierarchically the
  // silent rank's host leader (rank 0, same fake host).
  std::vector<int> must_name = mode == Mode::kShm   ? std::vector<int>{0, 1, 3}
                               : mode == Mode::kTcp ? std::vector<int>{3}
                                                    : std::vector<int>{0};
  for (int r : must_name) {
    INFO("rank " << r << ": " << message[r]);
    CHECK(peer[r] == silent);
    CHECK_THAT(message[r], Catch::Contains("rank " + std::to_string(silent)));
  }
}

TEST_CASE("abort() from another thread ends a pending collective on every rank", "[cpu_pg][abort]") {
  const int n = 3;
  const Mode mode = GENERATE(Mode::kShm, Mode::kTcp);
  CAPTURE(mode_name(mode));
  std::vector<std::string> message(n);
  Failures f;
  run_group(
      n, [&](int r) { return options_for(mode, r, 120s); },
      [&](int rank, ProcessGroup& pg, Failures& fail) {
        std::thread aborter;
        if (rank == 1) {
          aborter = std::thread([&pg] {
            std::this_thread::sleep_for(
                100ms);  // let the others block first; correctness does not depend on it
            pg.abort();
          });
        }
        std::vector<float> buf(1000, 1.0f);
        try {
          // Rank 1 joins late so that the others are blocked; its abort must wake them long before 120 s.
          if (rank == 1) std::this_thread::sleep_for(1s);
          for (int i = 0; i < 100000; ++i)
            pg.all_reduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
          fail.add("rank " + std::to_string(rank) + ": never failed");
        } catch (const CollectiveError& e) {
          message[rank] = e.what();
        }
        if (aborter.joinable()) aborter.join();
      },
      f);
  for (const auto& s : f.list) FAIL_CHECK(s);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << message[r]);
    CHECK_FALSE(message[r].empty());
  }
  CHECK_THAT(message[1], Catch::Contains("abort() was called on rank 1"));
}

TEST_CASE("bootstrap names a rank that never joins", "[cpu_pg][timeout]") {
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  rdzv::StoreClient store("127.0.0.1", server.port(), {.connect_timeout = 10s, .timeout = 10s});
  ProcessGroupOptions o;
  o.timeout = 300ms;
  try {
    make_cpu_process_group(store, "lonely", 0, 2, o);
    FAIL("bootstrap succeeded with one of two ranks");
  } catch (const CollectiveError& e) {
    CHECK(e.peer() == 1);
    CHECK_THAT(e.what(), Catch::Contains("rank 1 did not join"));
  }
}

TEST_CASE("single process group", "[cpu_pg]") {
  auto pg = make_single_process_group();
  float x[3] = {1, 2, 3}, out[3] = {};
  pg->all_reduce(x, 3, DType::kFloat32, ReduceOp::kAvg);
  CHECK(x[2] == 3.0f);
  pg->all_gather(x, out, 3, DType::kFloat32);
  CHECK(out[1] == 2.0f);
  CHECK_THROWS_AS(pg->broadcast(x, 3, DType::kFloat32, 1), std::invalid_argument);
  pg->abort();
  CHECK_THROWS_AS(pg->barrier(), CollectiveError);
}
