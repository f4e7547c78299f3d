// torch::Tensor collectives: dtype mapping, refusals with clear messages, and results across thread ranks.
#include "ddprun/tensor_ops.h"

#include <torch/types.h>

#include <mutex>

#include "catch_compat.h"
#include "rank_threads.h"

using namespace ddprun::sdk;
using ddprun::sdk::testing::all_empty;
using ddprun::sdk::testing::run_ranks;

TEST_CASE("torch dtypes map to DType; others are refused by name", "[tensor_ops]") {
  CHECK(to_dtype(torch::kFloat32) == DType::kFloat32);
  CHECK(to_dtype(torch::kFloat64) == DType::kFloat64);
  CHECK(to_dtype(torch::kHalf) == DType::kFloat16);
  CHECK(to_dtype(torch::kBFloat16) == DType::kBFloat16);
  CHECK(to_dtype(torch::kInt32) == DType::kInt32);
  CHECK(to_dtype(torch::kInt64) == DType::kInt64);
  CHECK(to_dtype(torch::kUInt8) == DType::kUInt8);
  CHECK_THROWS_WITH(to_dtype(torch::kBool), Catch::Contains("dtype Bool"));
  CHECK_THROWS_WITH(to_dtype(torch::kComplexFloat), Catch::Contains("not supported"));
}

TEST_CASE("tensors that cannot be sent are refused before any communication", "[tensor_ops]") {
  auto pg = make_single_process_group();
  auto t = torch::ones({4, 3});
  auto transposed = t.t();
  CHECK_THROWS_WITH(all_reduce(*pg, transposed),
                    Catch::Contains("all_reduce") && Catch::Contains("not contiguous"));
  torch::Tensor undefined;
  CHECK_THROWS_WITH(broadcast(*pg, undefined, 0),
                    Catch::Contains("broadcast") && Catch::Contains("undefined"));
  auto flags = torch::ones({2}, torch::kBool);
  CHECK_THROWS_AS(all_reduce(*pg, flags), std::invalid_argument);
  // The single-process group keeps the data and gathers one row.
  all_reduce(*pg, t, ReduceOp::kAvg);
  CHECK(torch::equal(t, torch::ones({4, 3})));
  CHECK(all_gather(*pg, t).sizes() == torch::IntArrayRef({1, 4, 3}));
}

TEST_CASE("all_reduce, broadcast and all_gather of tensors across ranks", "[tensor_ops]") {
  const int world = 3;
  std::mutex mu;
  std::vector<torch::Tensor> sums(world), avgs(world), maxes(world), bcast(world), gathered(world);
  auto errors = run_ranks(world, [&](int rank, ProcessGroup& pg) {
    auto s = torch::arange(6, torch::kInt64).reshape({2, 3}) * (rank + 1);
    all_reduce(pg, s, ReduceOp::kSum);
    auto a = torch::full({5}, static_cast<double>(rank), torch::kFloat64);
    all_reduce(pg, a, ReduceOp::kAvg);
    auto m = torch::tensor({rank, -rank}, torch::kInt32);
    all_reduce(pg, m, ReduceOp::kMax);
    auto b = torch::full({3}, rank == 1 ? 7.0f : -1.0f);
    broadcast(pg, b, 1);
    auto g = all_gather(pg, torch::full({2}, static_cast<float>(rank * 10)));
    std::lock_guard lk(mu);
    sums[rank] = s;
    avgs[rank] = a;
    maxes[rank] = m;
    bcast[rank] = b;
    gathered[rank] = g;
  });
  REQUIRE(all_empty(errors));
  for (int r = 0; r < world; ++r) {
    CHECK(torch::equal(sums[r], torch::arange(6, torch::kInt64).reshape({2, 3}) * 6));
    CHECK(torch::equal(avgs[r], torch::full({5}, 1.0, torch::kFloat64)));
    CHECK(torch::equal(maxes[r], torch::tensor({2, 0}, torch::kInt32)));
    CHECK(torch::equal(bcast[r], torch::full({3}, 7.0f)));
    CHECK(torch::equal(gathered[r], torch::tensor({0.f, 0.f, 10.f, 10.f, 20.f, 20.f}).reshape({3, 2})));
  }
}
