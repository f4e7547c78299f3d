// GradientSynchronizer with ranks as threads over the CPU backend: after backward, every rank's gradients
// equal the full-batch gradient of one process (world sizes 1-4, float32/float64, several buckets, two
// steps), the parameters are broadcast at construction, the first bucket is all-reduced while backward still
// runs, no_sync accumulates locally, unused parameters are averaged too, half/bfloat16 get buckets of their
// own, mismatching models are refused, and a dead peer surfaces from backward as CollectiveError naming it.
// The CUDA + NCCL case prints "SKIPPED: no CUDA device" where there is none.
#include "ddprun/gradient_sync.h"

#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "catch_compat.h"
#include "ddprun/tensor_ops.h"
#include "rank_threads.h"

using namespace ddprun::sdk;
using ddprun::sdk::testing::all_empty;
using ddprun::sdk::testing::run_ranks;

namespace {

constexpr int64_t kRows = 24;  // divisible by 1, 2, 3, 4 (and by 2 again for the no_sync halves)

torch::nn::Sequential make_net(torch::Dtype dtype) {
  torch::nn::Sequential net(torch::nn::Linear(5, 7), torch::nn::Tanh(), torch::nn::Linear(7, 6),
                            torch::nn::Tanh(), torch::nn::Linear(6, 1));
  net->to(dtype);
  return net;
}

struct Data {
  torch::Tensor x, y;
};

Data make_data(torch::Dtype dtype) {
  auto gen = at::detail::createCPUGenerator(99);
  Data d;
  d.x = at::randn({kRows, 5}, gen).to(dtype);
  d.y = at::randn({kRows, 1}, gen).to(dtype);
  return d;
}

std::vector<torch::Tensor> values(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

std::vector<torch::Tensor> grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters())
    out.push_back(p.grad().defined() ? p.grad().detach().clone() : torch::Tensor());
  return out;
}

void assign(torch::nn::Module& m, const std::vector<torch::Tensor>& vals) {
  torch::NoGradGuard no_grad;
  auto ps = m.parameters();
  for (size_t i = 0; i < ps.size(); ++i) ps[i].copy_(vals[i]);
}

void sgd_step(torch::nn::Module& m, double lr) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    p.sub_(p.grad() * lr);
    p.grad().zero_();
  }
}

bool close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double rtol,
           double atol) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].defined() || !b[i].defined() || !torch::allclose(a[i], b[i], rtol, atol)) return false;
  }
  return true;
}

// Caps of 8 and 20 elements: the 6 parameters (35, 7, 42, 6, 6, 1 elements) fall into several buckets.
GradientSyncOptions small_buckets(torch::Dtype dtype = torch::kFloat64) {
  GradientSyncOptions o;
  o.first_bucket_cap_bytes = 8 * c10::elementSize(dtype);
  o.bucket_cap_bytes = 20 * c10::elementSize(dtype);
  return o;
}

// A group of one that records its all_reduce calls (and lets a test wait for the first).
class RecordingGroup final : public ProcessGroup {
 public:
  RecordingGroup() : ProcessGroup(0, 1) {}
  const char* backend() const override { return "recording"; }
  void all_reduce(void*, size_t count, DType, ReduceOp op) override {
    std::lock_guard lk(mu);
    counts.push_back(count);
    ops.push_back(op);
    cv.notify_all();
  }
  void broadcast(void*, size_t, DType, int) override {}
  void all_gather(const void* in, void* out, size_t count, DType dtype) override {
    std::memcpy(out, in, count * dtype_size(dtype));
  }
  void barrier() override {}
  void abort() override {}
  // True when the first all_reduce started within 30 s.
  bool wait_first() {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(30), [&] { return !counts.empty(); });
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<size_t> counts;
  std::vector<ReduceOp> ops;
};

}  // namespace

TEST_CASE("the first bucket is all-reduced while backward is still running", "[gradient_sync]") {
  RecordingGroup pg;
  auto net = make_net(torch::kFloat64);
  GradientSynchronizer sync(*net, pg, small_buckets());
  const size_t buckets = sync.bucket_assignment().size();
  REQUIRE(buckets >= 3);
  const Data data = make_data(torch::kFloat64);
  auto x = data.x.clone().requires_grad_();
  bool started_before_end = false;
  // The gradient w.r.t. the input is the last thing backward computes.
  x.register_hook([&](const torch::Tensor& g) {
    started_before_end = pg.wait_first();
    return g;
  });
  torch::mse_loss(net->forward(x), data.y).backward();
  CHECK(started_before_end);
  CHECK(pg.counts.size() == buckets);
  CHECK(pg.counts.front() == 13);  // first bucket (cap 8): last Linear (1 + 6), then the bias before it (6)
  for (auto op : pg.ops) CHECK(op == ReduceOp::kAvg);
}

TEST_CASE("synchronised gradients equal the single-process full-batch gradient", "[gradient_sync]") {
  const int world = GENERATE(1, 2, 3, 4);
  const auto dtype = GENERATE(torch::kFloat64, torch::kFloat32);
  const double rtol = dtype == torch::kFloat64 ? 1e-10 : 2e-5;
  CAPTURE(world, dtype);
  const Data data = make_data(dtype);

  // Reference: one process, the whole batch, two SGD steps.
  torch::manual_seed(7);
  auto ref = make_net(dtype);
  const auto initial = values(*ref);
  std::vector<std::vector<torch::Tensor>> ref_grads;
  for (int it = 0; it < 2; ++it) {
    torch::mse_loss(ref->forward(data.x), data.y).backward();
    ref_grads.push_back(grads(*ref));
    sgd_step(*ref, 0.1);
  }

  std::mutex mu;
  std::vector<std::vector<std::vector<torch::Tensor>>> got(world);  // [rank][iteration]
  std::vector<std::vector<torch::Tensor>> after_broadcast(world);
  std::vector<size_t> num_buckets(world);
  std::vector<GradientSyncStats> stats(world);
  std::vector<std::vector<std::vector<size_t>>> assignment(world);
  auto errors = run_ranks(world, [&](int rank, ProcessGroup& pg) {
    auto net = make_net(dtype);  // random weights: the synchroniser must broadcast rank 0's
    if (rank == 0) assign(*net, initial);
    GradientSynchronizer sync(*net, pg, small_buckets(dtype));
    auto start = values(*net);
    const int64_t shard = kRows / world;
    std::vector<std::vector<torch::Tensor>> mine;
    for (int it = 0; it < 2; ++it) {
      auto x = data.x.narrow(0, rank * shard, shard), y = data.y.narrow(0, rank * shard, shard);
      torch::mse_loss(net->forward(x), y).backward();  // averaged when backward returns: no finish() call
      mine.push_back(grads(*net));
      sgd_step(*net, 0.1);
    }
    std::lock_guard lk(mu);
    got[rank] = std::move(mine);
    after_broadcast[rank] = std::move(start);
    num_buckets[rank] = sync.bucket_assignment().size();
    stats[rank] = sync.last_stats();
    assignment[rank] = sync.bucket_assignment();
  });
  REQUIRE(all_empty(errors));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(close(after_broadcast[r], initial, 0, 0));
    for (int it = 0; it < 2; ++it) {
      CAPTURE(it);
      CHECK(close(got[r][it], ref_grads[it], rtol, rtol * 1e-2));
    }
  }
  // Several buckets, every parameter exactly once, launched from the last parameter backwards.
  CHECK(num_buckets[0] >= 3);
  std::vector<size_t> flat;
  for (const auto& b : assignment[0]) flat.insert(flat.end(), b.begin(), b.end());
  std::vector<size_t> expect(flat.size());
  for (size_t i = 0; i < expect.size(); ++i) expect[i] = expect.size() - 1 - i;
  CHECK(flat == expect);
  CHECK(flat.size() == ref->parameters().size());
  CHECK(stats[0].buckets == num_buckets[0]);
  size_t bytes = 0;
  for (const auto& p : ref->parameters()) bytes += static_cast<size_t>(p.numel()) * p.element_size();
  CHECK(stats[0].bytes == bytes);
  if (world > 1) CHECK(stats[0].communication.count() > 0);
}

TEST_CASE("bucket assignment: first bucket cap, then bucket cap, in reverse order", "[gradient_sync]") {
  // Parameters of 100, 100, 100, 400, 40 float32 elements (400, 400, 400, 1600, 160 bytes).
  std::vector<torch::Tensor> params;
  for (int64_t n : {100, 100, 100, 400, 40}) params.push_back(torch::zeros({n}).requires_grad_());
  auto pg = make_single_process_group();
  GradientSyncOptions o;
  o.first_bucket_cap_bytes = 500;
  o.bucket_cap_bytes = 1000;
  GradientSynchronizer sync(params, {}, *pg, o);
  // Reverse: 4 (160) + 3 (1600) >= 500 closes the first bucket; then 2+1+0 = 1200 >= 1000.
  CHECK(sync.bucket_assignment() == std::vector<std::vector<size_t>>{{4, 3}, {2, 1, 0}});
}

TEST_CASE("no_sync accumulates locally; the next synchronised backward averages the sum", "[gradient_sync]") {
  const int world = 2;
  const Data data = make_data(torch::kFloat64);
  torch::manual_seed(3);
  auto ref = make_net(torch::kFloat64);
  const auto initial = values(*ref);
  const int64_t shard = kRows / world, half = shard / 2;
  for (int r = 0; r < world; ++r) {
    for (int h = 0; h < 2; ++h) {
      auto rows = r * shard + h * half;
      torch::mse_loss(ref->forward(data.x.narrow(0, rows, half)), data.y.narrow(0, rows, half)).backward();
    }
  }
  std::vector<torch::Tensor> expect;
  for (auto& g : grads(*ref)) expect.push_back(g / world);

  std::mutex mu;
  std::vector<std::vector<torch::Tensor>> local(world), synced(world);
  auto errors = run_ranks(world, [&](int rank, ProcessGroup& pg) {
    auto net = make_net(torch::kFloat64);
    if (rank == 0) assign(*net, initial);
    GradientSynchronizer sync(*net, pg, small_buckets());
    auto part = [&](int h) {
      auto rows = rank * shard + h * half;
      return torch::mse_loss(net->forward(data.x.narrow(0, rows, half)), data.y.narrow(0, rows, half));
    };
    {
      auto guard = sync.no_sync();
      part(0).backward();
    }
    auto l = grads(*net);
    part(1).backward();
    std::lock_guard lk(mu);
    local[rank] = l;
    synced[rank] = grads(*net);
  });
  REQUIRE(all_empty(errors));
  CHECK_FALSE(close(local[0], local[1], 1e-6, 0));  // not averaged inside no_sync
  CHECK(close(synced[0], expect, 1e-10, 1e-12));
  CHECK(close(synced[1], expect, 1e-10, 1e-12));
}

TEST_CASE("a parameter unused on one rank gets the average of the others' gradients", "[gradient_sync]") {
  std::mutex mu;
  std::vector<torch::Tensor> ga(2), gb(2);
  auto errors = run_ranks(2, [&](int rank, ProcessGroup& pg) {
    auto a = torch::ones({3}, torch::kFloat64).requires_grad_();
    auto b = torch::ones({2}, torch::kFloat64).requires_grad_();
    GradientSynchronizer sync({a, b}, {}, pg);
    auto loss = (a * (rank + 1.0)).sum();
    if (rank == 0) loss = loss + (b * 4.0).sum();  // b unused on rank 1
    loss.backward();
    std::lock_guard lk(mu);
    ga[rank] = a.grad().clone();
    gb[rank] = b.grad().defined() ? b.grad().clone() : torch::Tensor();
  });
  REQUIRE(all_empty(errors));
  for (int r = 0; r < 2; ++r) {
    CHECK(torch::equal(ga[r], torch::full({3}, 1.5, torch::kFloat64)));
    REQUIRE(gb[r].defined());
    CHECK(torch::equal(gb[r], torch::full({2}, 2.0, torch::kFloat64)));
  }
}

TEST_CASE("find_unused_parameters: a parameter no rank used keeps an undefined gradient", "[gradient_sync]") {
  const bool find_unused = GENERATE(true, false);
  CAPTURE(find_unused);
  std::mutex mu;
  std::vector<torch::Tensor> ga(3), gb(3), gc(3);
  auto errors = run_ranks(3, [&](int rank, ProcessGroup& pg) {
    auto a = torch::ones({3}, torch::kFloat64).requires_grad_();
    auto b = torch::ones({2}, torch::kFloat64).requires_grad_();  // used by rank 2 only
    auto c = torch::ones({4}, torch::kFloat64).requires_grad_();  // used by no rank
    GradientSyncOptions o;
    o.find_unused_parameters = find_unused;
    GradientSynchronizer sync({a, b, c}, {}, pg, o);
    for (int step = 0; step < 2; ++step) {  // the second step starts from the first one's gradients
      auto loss = (a * (rank + 1.0)).sum();
      if (rank == 2) loss = loss + (b * 6.0).sum();
      loss.backward();
    }
    std::lock_guard lk(mu);
    ga[rank] = a.grad().clone();
    gb[rank] = b.grad().defined() ? b.grad().clone() : torch::Tensor();
    gc[rank] = c.grad().defined() ? c.grad().clone() : torch::Tensor();
  });
  REQUIRE(all_empty(errors));
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    // Step 1 averages (1+2+3)/3 = 2; step 2 accumulates 2 + rank+1 locally, averaged: 2 + 2 = 4.
    CHECK(torch::equal(ga[r], torch::full({3}, 4.0, torch::kFloat64)));
    REQUIRE(gb[r].defined());
    // Step 1: (0+0+6)/3 = 2 on every rank; step 2: (2+2+(2+6))/3 = 4.
    CHECK(torch::equal(gb[r], torch::full({2}, 4.0, torch::kFloat64)));
    if (find_unused) {
      CHECK_FALSE(gc[r].defined());
    } else {
      REQUIRE(gc[r].defined());
      CHECK(torch::equal(gc[r], torch::zeros({4}, torch::kFloat64)));
    }
  }
}

TEST_CASE("a sparse gradient is refused from backward and breaks the synchroniser", "[gradient_sync]") {
  auto pg = make_single_process_group();
  torch::nn::Embedding emb(torch::nn::EmbeddingOptions(10, 3).sparse(true));
  GradientSynchronizer sync(*emb, *pg);
  auto idx = torch::tensor({1, 2, 2}, torch::kLong);
  CHECK_THROWS_WITH(emb->forward(idx).sum().backward(), Catch::Contains("sparse gradient"));
  CHECK_THROWS_WITH(emb->forward(idx).sum().backward(), Catch::Contains("sparse gradient"));
}

TEST_CASE("float16 and bfloat16 parameters are averaged in their own buckets", "[gradient_sync]") {
  const int world = 3;
  std::mutex mu;
  std::vector<torch::Tensor> gh(world), gbf(world);
  size_t buckets = 0;
  auto errors = run_ranks(world, [&](int rank, ProcessGroup& pg) {
    auto h = torch::zeros({8}, torch::kHalf).requires_grad_();
    auto bf = torch::zeros({5}, torch::kBFloat16).requires_grad_();
    GradientSynchronizer sync({h, bf}, {}, pg);
    // d/dh = rank + 1 + i/8, exactly representable; the average over 3 ranks is 2 + i/8.
    auto coef = torch::arange(8, torch::kFloat) / 8 + (rank + 1);
    auto loss = (h.to(torch::kFloat) * coef).sum() + (bf.to(torch::kFloat) * (2.0 * rank)).sum();
    loss.backward();
    std::lock_guard lk(mu);
    gh[rank] = h.grad().to(torch::kFloat);
    gbf[rank] = bf.grad().to(torch::kFloat);
    buckets = sync.bucket_assignment().size();
  });
  REQUIRE(all_empty(errors));
  CHECK(buckets == 2);
  for (int r = 0; r < world; ++r) {
    CHECK(torch::allclose(gh[r], torch::arange(8, torch::kFloat) / 8 + 2, 1e-3, 1e-3));
    CHECK(torch::allclose(gbf[r], torch::full({5}, 2.0f), 1e-2, 1e-2));
  }
}

TEST_CASE("ranks with different models are refused at construction", "[gradient_sync]") {
  auto errors = run_ranks(2, [&](int rank, ProcessGroup& pg) {
    torch::nn::Linear net(5, rank == 0 ? 7 : 8);
    GradientSynchronizer sync(*net, pg);
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("different parameters"));
}

TEST_CASE("a dead peer surfaces from backward as CollectiveError naming it", "[gradient_sync]") {
  std::mutex mu;
  std::string what, second;
  int peer = -2;
  bool caught = false;
  auto errors = run_ranks(
      2,
      [&](int rank, ProcessGroup& pg) {
        auto w = torch::ones({4}, torch::kFloat32).requires_grad_();
        GradientSynchronizer sync({w}, {}, pg);
        if (rank == 1) {
          pg.abort();  // as if this rank died: its peers' collectives fail promptly
          return;
        }
        try {
          (w * 2).sum().backward();
        } catch (const CollectiveError& e) {
          std::lock_guard lk(mu);
          caught = true;
          what = e.what();
          peer = e.peer();
        }
        try {
          (w * 2).sum().backward();  // broken: throws at once
        } catch (const std::exception& e) {
          std::lock_guard lk(mu);
          second = e.what();
        }
      },
      std::chrono::seconds(20));
  REQUIRE(all_empty(errors));
  REQUIRE(caught);
  CHECK_THAT(what, Catch::Contains("all_reduce") && Catch::Contains("bucket 0/1"));
  CHECK(peer == 1);
  CHECK_THAT(second, Catch::Contains("bucket 0/1"));
}

TEST_CASE("finish() is a no-op after backward and when idle; the destructor detaches the hooks",
          "[gradient_sync]") {
  auto pg = make_single_process_group();
  auto w = torch::ones({4}, torch::kFloat32).requires_grad_();
  {
    GradientSynchronizer sync({w}, {}, *pg);
    sync.finish();
    (w * 3).sum().backward();
    sync.finish();
    CHECK(torch::equal(w.grad(), torch::full({4}, 3.0f)));
    CHECK(sync.last_stats().buckets == 1);
    CHECK(sync.last_stats().bytes == 16);
  }
  w.mutable_grad() = torch::Tensor();
  (w * 5).sum().backward();  // no synchroniser any more: plain local gradient
  CHECK(torch::equal(w.grad(), torch::full({4}, 5.0f)));
}

TEST_CASE("GradientSynchronizer on CUDA parameters with the NCCL backend", "[gradient_sync][gpu]") {
  if (!torch::cuda::is_available() || !nccl_available()) {
    std::puts("SKIPPED: no CUDA device (GradientSynchronizer on CUDA with NCCL)");
    WARN("SKIPPED: no CUDA device");
    return;
  }
  using namespace std::chrono_literals;
  ddprun::rdzv::StoreServerThread server(ddprun::rdzv::StoreServerOptions{.host = "127.0.0.1"});
  ddprun::rdzv::StoreClient store("127.0.0.1", server.port(), {.connect_timeout = 10s, .timeout = 30s});
  auto pg = make_nccl_process_group(store, "nccl_sync", 0, 1, 0);
  const Data data = make_data(torch::kFloat32);
  torch::manual_seed(11);
  auto ref = make_net(torch::kFloat32);
  torch::mse_loss(ref->forward(data.x), data.y).backward();
  auto net = make_net(torch::kFloat32);
  assign(*net, values(*ref));
  net->to(torch::Device(torch::kCUDA, 0));
  GradientSynchronizer sync(*net, *pg, small_buckets(torch::kFloat32));
  torch::mse_loss(net->forward(data.x.cuda()), data.y.cuda()).backward();
  std::vector<torch::Tensor> got;
  for (auto& g : grads(*net)) got.push_back(g.cpu());
  CHECK(close(got, grads(*ref), 1e-4, 1e-5));
  CHECK(sync.last_stats().buckets == sync.bucket_assignment().size());
}
