// sdk_gradient_check: a worker program for ddprun's tests of the gradient synchroniser with ranks as real
// processes. Run under `ddprun --standalone --nproc_per_node N --no_python sdk_gradient_check [flags]` (or
// with the RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT environment), every rank builds the same data (fixed
// seed) and a 4-layer MLP, trains its shard of the rows with a GradientSynchronizer, and checks after every
// backward that its averaged gradients equal the full-batch gradient it computes itself on a separate copy
// of the model (same initial weights, no synchroniser).
//
//   sdk_gradient_check [--rows G] [--steps S] [--threads T] [--timeout-ms MS]
//                      [--skip-sync-on-rank R] [--scale-loss-on-rank R F]
//
// Runs: {float64, float32} x {small bucket caps (several buckets), default caps}. Each run: the parameters
// must equal rank 0's after construction (ranks other than 0 start from other random weights); S SGD steps,
// each compared with the reference; then one step of two micro-batches, the first inside no_sync() (its
// gradient must be the local one, not averaged), the second synchronised (the full-batch gradient again).
// Shards may be uneven (G not divisible by the world size): each rank's loss is its sum of squared errors
// times world/(G*outputs), so the average over ranks is exactly the full-batch mean squared error.
// At the end every rank all-gathers a 64-bit hash of its parameters' bytes: all must be bit-identical.
// Tolerance (max |synced - reference| over max |reference|, per parameter): float64 1e-10, float32 2e-5.
//
// Deliberate faults, so a test can prove the check fails:
//   --skip-sync-on-rank R     rank R builds no synchroniser (and starts from rank 0's weights, as if loaded
//                             from a checkpoint): its gradients stay local; it reports the mismatch and exits
//                             while the others wait for it in the synchroniser's construction.
//   --scale-loss-on-rank R F  rank R multiplies its loss by F: every rank's averaged gradient is off.
//
// Output: one line per rank, "sdk_gradient_check: rank r of n: ok ..." or "sdk_gradient_check: rank r of n:
// MISMATCH <what> param <i> max rel error <e> (tolerance <t>)".
// Exit codes: 0 every check passed, 1 a mismatch, 2 bad usage, 3 CollectiveError, 4 other error.
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ddprun/context.h"
#include "ddprun/gradient_sync.h"
#include "ddprun/tensor_ops.h"

using namespace ddprun::sdk;

namespace {

constexpr int64_t kInputs = 24, kOutputs = 3;
constexpr double kLearningRate = 0.05;

struct Flags {
  int64_t rows = 840;  // divisible by 1..8
  int steps = 3;
  int threads = 1;
  long timeout_ms = 60000;
  int skip_sync_rank = -1;
  int scale_rank = -1;
  double scale = 1.0;
};

// A mismatch found by this rank: printed, and the program exits 1.
struct Mismatch {
  std::string what;
};

torch::nn::Sequential make_net(torch::Dtype dtype) {
  torch::nn::Sequential net(torch::nn::Linear(kInputs, 64), torch::nn::Tanh(), torch::nn::Linear(64, 64),
                            torch::nn::Tanh(), torch::nn::Linear(64, 32), torch::nn::Tanh(),
                            torch::nn::Linear(32, kOutputs));
  net->to(dtype);
  return net;
}

std::vector<torch::Tensor> snapshot(torch::nn::Module& m, bool gradients) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) {
    const torch::Tensor& t = gradients ? p.grad() : p;
    out.push_back(t.defined() ? t.detach().clone() : torch::Tensor());
  }
  return out;
}

void assign(torch::nn::Module& m, const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  auto ps = m.parameters();
  for (size_t i = 0; i < ps.size(); ++i) ps[i].copy_(values[i]);
}

void zero_grad(torch::nn::Module& m) {
  for (auto& p : m.parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

void sgd_step(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.sub_(p.grad() * kLearningRate);
}

// Largest per-parameter relative error; throws Mismatch naming the parameter above `tolerance`.
double compare(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
               double tolerance, const std::string& what) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    char buf[160];
    if (!got[i].defined()) {
      std::snprintf(buf, sizeof buf, " param %zu: no gradient", i);
      throw Mismatch{what + buf};
    }
    const double scale = want[i].abs().max().item<double>();
    const double err = (got[i] - want[i]).abs().max().item<double>() / std::max(scale, 1e-300);
    if (!(err <= tolerance)) {  // also catches NaN
      std::ostringstream shape;
      shape << want[i].sizes();
      std::snprintf(buf, sizeof buf, " param %zu %s: max rel error %.3g (tolerance %.1g)", i,
                    shape.str().c_str(), err, tolerance);
      throw Mismatch{what + buf};
    }
    worst = std::max(worst, err);
  }
  return worst;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct RunResult {
  size_t buckets = 0;
  double max_error = 0;
  uint64_t checksum = 1469598103934665603ull;
};

// One run: construction + broadcast check, `steps` synchronised SGD steps, one no_sync step.
RunResult run_one(Context& ctx, const Flags& f, torch::Dtype dtype, bool small_buckets) {
  auto& pg = ctx.process_group();
  const int n = ctx.world_size(), me = ctx.rank();
  const double tolerance = dtype == torch::kFloat64 ? 1e-10 : 2e-5;
  const std::string run_name = std::string(dtype == torch::kFloat64 ? "float64" : "float32") +
                               (small_buckets ? " small" : " default") + " buckets";

  auto gen = at::detail::createCPUGenerator(1234);
  const torch::Tensor x = at::randn({f.rows, kInputs}, gen).to(dtype);
  const torch::Tensor y = at::randn({f.rows, kOutputs}, gen).to(dtype);
  // Contiguous shards, the first rows % n ranks one row longer (as torch.tensor_split).
  const int64_t base = f.rows / n, extra = f.rows % n;
  const int64_t begin = me * base + std::min<int64_t>(me, extra), len = base + (me < extra ? 1 : 0);
  const double weight = static_cast<double>(n) / static_cast<double>(f.rows * kOutputs);
  auto shard_loss = [&](torch::nn::Sequential& net, int64_t from, int64_t count) {
    auto out = net->forward(x.narrow(0, from, count));
    auto loss = torch::mse_loss(out, y.narrow(0, from, count), torch::Reduction::Sum) * weight;
    return me == f.scale_rank ? loss * f.scale : loss;
  };

  torch::manual_seed(42);
  auto ref = make_net(dtype);
  const auto initial = snapshot(*ref, false);
  torch::manual_seed(1000 + me);
  auto net = make_net(dtype);  // other random weights: the synchroniser must broadcast rank 0's
  if (me == 0 || me == f.skip_sync_rank) assign(*net, initial);

  GradientSyncOptions options;
  if (small_buckets) {  // parameters of 1536..4096 elements: several buckets
    const size_t elem = c10::elementSize(dtype);
    options.first_bucket_cap_bytes = 100 * elem;
    options.bucket_cap_bytes = 2000 * elem;
  }
  std::optional<GradientSynchronizer> sync;
  if (me != f.skip_sync_rank) sync.emplace(*net, pg, options);
  RunResult res;
  res.buckets = sync ? sync->bucket_assignment().size() : 0;
  compare(snapshot(*net, false), initial, 0, run_name + ": parameters after construction");

  auto reference_grads = [&] {
    zero_grad(*ref);
    torch::mse_loss(ref->forward(x), y).backward();
    return snapshot(*ref, true);
  };
  for (int step = 0; step < f.steps; ++step) {
    const auto want = reference_grads();
    zero_grad(*net);
    shard_loss(net, begin, len).backward();  // averaged when backward returns
    res.max_error = std::max(res.max_error, compare(snapshot(*net, true), want, tolerance,
                                                    run_name + ": step " + std::to_string(step)));
    if (sync && sync->last_stats().buckets != res.buckets) {
      throw Mismatch{run_name + ": step " + std::to_string(step) + ": " +
                     std::to_string(sync->last_stats().buckets) + " buckets all-reduced of " +
                     std::to_string(res.buckets)};
    }
    sgd_step(*ref);
    sgd_step(*net);
  }

  // Gradient accumulation: micro-batch 1 inside no_sync (local only), micro-batch 2 synchronised.
  const auto want = reference_grads();
  const int64_t half = len / 2;
  auto local = make_net(dtype);
  assign(*local, snapshot(*net, false));
  shard_loss(local, begin, half).backward();
  zero_grad(*net);
  {
    std::optional<GradientSynchronizer::NoSyncGuard> guard;
    if (sync) guard.emplace(sync->no_sync());
    shard_loss(net, begin, half).backward();
  }
  compare(snapshot(*net, true), snapshot(*local, true), tolerance, run_name + ": no_sync micro-batch");
  shard_loss(net, begin + half, len - half).backward();
  res.max_error = std::max(res.max_error, compare(snapshot(*net, true), want, tolerance,
                                                  run_name + ": step after no_sync accumulation"));
  sgd_step(*net);

  for (const auto& p : net->parameters()) {
    const torch::Tensor c = p.detach().contiguous();
    res.checksum = fnv1a(res.checksum, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  return res;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: sdk_gradient_check [--rows G] [--steps S] [--threads T] [--timeout-ms MS]\n"
               "                          [--skip-sync-on-rank R] [--scale-loss-on-rank R F]\n");
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage();
    const char* v = argv[++i];
    if (a == "--rows") {
      f.rows = std::atoll(v);
    } else if (a == "--steps") {
      f.steps = std::atoi(v);
    } else if (a == "--threads") {
      f.threads = std::atoi(v);
    } else if (a == "--timeout-ms") {
      f.timeout_ms = std::atol(v);
    } else if (a == "--skip-sync-on-rank") {
      f.skip_sync_rank = std::atoi(v);
    } else if (a == "--scale-loss-on-rank" && i + 1 < argc) {
      f.scale_rank = std::atoi(v);
      f.scale = std::atof(argv[++i]);
    } else {
      usage();
    }
  }
  if (f.rows < 1 || f.steps < 0 || f.threads < 1 || f.timeout_ms < 1) usage();
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  torch::set_num_threads(f.threads);
  std::unique_ptr<Context> ctx;
  try {
    ctx = init({.backend = Backend::kCpu, .timeout = std::chrono::milliseconds(f.timeout_ms)});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdk_gradient_check: init failed: %s\n", e.what());
    return 4;
  }
  const int me = ctx->rank(), n = ctx->world_size();
  if (f.rows < 2 * n) {
    std::fprintf(stderr, "sdk_gradient_check: --rows %lld is less than twice the world size %d\n",
                 static_cast<long long>(f.rows), n);
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    size_t buckets_small = 0, buckets_default = 0;
    double err64 = 0, err32 = 0;
    uint64_t checksum = 1469598103934665603ull;
    for (torch::Dtype dtype : {torch::kFloat64, torch::kFloat32}) {
      for (bool small : {true, false}) {
        const RunResult r = run_one(*ctx, f, dtype, small);
        size_t& buckets = small ? buckets_small : buckets_default;
        double& err = dtype == torch::kFloat64 ? err64 : err32;
        buckets = std::max(buckets, r.buckets);
        err = std::max(err, r.max_error);
        checksum = fnv1a(checksum, &r.checksum, sizeof r.checksum);
      }
    }
    if (f.skip_sync_rank < 0 && buckets_small < 3) {
      throw Mismatch{"small bucket caps gave " + std::to_string(buckets_small) + " buckets (want >= 3)"};
    }
    // Every rank must end with bit-identical parameters.
    torch::Tensor mine = torch::full({1}, static_cast<int64_t>(checksum), torch::kInt64);
    const torch::Tensor all = all_gather(ctx->process_group(), mine);
    for (int r = 0; r < n; ++r) {
      if (all[r].item<int64_t>() != static_cast<int64_t>(checksum)) {
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "final parameters differ from rank %d's (hash %016" PRIx64 " vs %016" PRIx64 ")", r,
                      static_cast<uint64_t>(all[r].item<int64_t>()), checksum);
        throw Mismatch{buf};
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "sdk_gradient_check: rank %d of %d: ok: %lld rows, %d+1 steps x {float64, float32} x {%zu, %zu "
        "buckets}; "
        "max rel error float64 %.2g, float32 %.2g; parameters hash %016" PRIx64
        " on every rank; %s; %.2f s\n",
        me, n, static_cast<long long>(f.rows), f.steps, buckets_small, buckets_default, err64, err32,
        checksum, ctx->process_group().describe().c_str(), s);
    return 0;
  } catch (const Mismatch& m) {
    std::printf("sdk_gradient_check: rank %d of %d: MISMATCH %s\n", me, n, m.what.c_str());
    std::fflush(stdout);
    // Exit at once: the other ranks may be blocked in a collective this rank will never join.
    std::_Exit(1);
  } catch (const CollectiveError& e) {
    std::printf("sdk_gradient_check: rank %d of %d: CollectiveError peer=%d: %s\n", me, n, e.peer(),
                e.what());
    std::fflush(stdout);
    std::_Exit(3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdk_gradient_check: rank %d of %d: %s\n", me, n, e.what());
    std::fflush(stderr);
    std::_Exit(4);
  }
}
