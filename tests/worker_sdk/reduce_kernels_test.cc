// Unit tests of the CPU backend's reduction kernels: rounding of fp16/bf16, integer wrap-around and
// truncating averages, multi-source order, every dtype through the vectorised entry points.
#include "worker_sdk/src/reduce_kernels.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "catch_compat.h"

using namespace ddprun::sdk;

TEST_CASE("fp16 conversion rounds to nearest even", "[reduce]") {
  CHECK(float_to_half(1.0f) == 0x3C00);
  CHECK(half_to_float(0x3C00) == 1.0f);
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): rounds up.
  CHECK(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  // Just above the halfway point rounds up.
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3C01);
  CHECK(float_to_half(65504.0f) == 0x7BFF);
  CHECK(float_to_half(65520.0f) == 0x7C00);  // rounds to infinity
  CHECK(std::isnan(half_to_float(float_to_half(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
}

TEST_CASE("bf16 conversion rounds to nearest even", "[reduce]") {
  CHECK(float_to_bfloat16(1.0f) == 0x3F80);
  CHECK(bfloat16_to_float(0x3F80) == 1.0f);
  CHECK(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);      // tie -> even
  CHECK(float_to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);  // tie -> even (up)
  CHECK(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -12)) == 0x3F81);
  CHECK(float_to_bfloat16(std::numeric_limits<float>::max()) == 0x7F80);  // overflow -> inf
  uint16_t nan = float_to_bfloat16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(bfloat16_to_float(nan)));
  // A NaN whose payload sits only in the low bits must stay a NaN, not become infinity.
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(__builtin_bit_cast(float, 0x7F800001u)))));
}

TEST_CASE("fp16 sums are rounded once per kernel call", "[reduce]") {
  // 2048 + 1 is not representable in fp16 (spacing 2 there): the tie rounds to even, 2048.
  std::vector<uint16_t> a(37, float_to_half(2048.0f)), b(37, float_to_half(1.0f));
  reduce_into(a.data(), b.data(), a.size(), DType::kFloat16, ReduceOp::kSum);
  for (auto v : a) CHECK(half_to_float(v) == 2048.0f);
  // Three sources accumulate in float: 2048 + 1 + 1 = 2050 exactly, no intermediate rounding.
  std::vector<uint16_t> x(37, float_to_half(2048.0f)), y(37, float_to_half(1.0f)), out(37);
  const void* srcs[] = {x.data(), y.data(), y.data()};
  reduce_sources(out.data(), srcs, 3, out.size(), DType::kFloat16, ReduceOp::kSum);
  for (auto v : out) CHECK(half_to_float(v) == 2050.0f);
}

TEST_CASE("bf16 sum, max and avg", "[reduce]") {
  const size_t n = 1000;
  std::vector<uint16_t> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = float_to_bfloat16(static_cast<float>(i % 50));
    b[i] = float_to_bfloat16(static_cast<float>(i % 7));
  }
  auto sum = a;
  reduce_into(sum.data(), b.data(), n, DType::kBFloat16, ReduceOp::kSum);
  auto mx = a;
  reduce_into(mx.data(), b.data(), n, DType::kBFloat16, ReduceOp::kMax);
  auto avg = a;
  reduce_into(avg.data(), b.data(), n, DType::kBFloat16, ReduceOp::kAvg, 2);
  for (size_t i = 0; i < n; ++i) {
    float x = static_cast<float>(i % 50), y = static_cast<float>(i % 7);
    CHECK(bfloat16_to_float(sum[i]) == x + y);
    CHECK(bfloat16_to_float(mx[i]) == std::max(x, y));
    CHECK(bfloat16_to_float(avg[i]) == bfloat16_to_float(float_to_bfloat16((x + y) / 2)));
  }
}

TEST_CASE("integer avg truncates toward zero, sums wrap", "[reduce]") {
  std::vector<int32_t> a = {7, -7, 8, -8, 1, 2147483647}, b = {0, 0, 1, -1, 0, 1};
  reduce_into(a.data(), b.data(), a.size(), DType::kInt32, ReduceOp::kAvg, 2);
  CHECK(a == std::vector<int32_t>{3, -3, 4, -4, 0, -1073741824});  // the last sum wrapped to INT_MIN

  std::vector<int64_t> c = {-9, 9, 10}, d = {0, 0, 1}, e = {0, 0, 1};
  const void* srcs[] = {c.data(), d.data(), e.data()};
  std::vector<int64_t> out(3);
  reduce_sources(out.data(), srcs, 3, 3, DType::kInt64, ReduceOp::kAvg, 3);
  CHECK(out == std::vector<int64_t>{-3, 3, 4});

  std::vector<uint8_t> u = {200, 100, 255}, v = {100, 100, 1};
  reduce_into(u.data(), v.data(), 3, DType::kUInt8, ReduceOp::kSum);
  CHECK(u == std::vector<uint8_t>{44, 200, 0});  // wraps modulo 256

  std::vector<int32_t> w = {-7, 7, 9};
  divide_by(w.data(), w.size(), DType::kInt32, 2);
  CHECK(w == std::vector<int32_t>{-3, 3, 4});
}

TEMPLATE_TEST_CASE("max, min and sum over many sources, every length", "[reduce]", float, double, int32_t,
                   int64_t, uint8_t) {
  const DType dt = std::is_same_v<TestType, float>     ? DType::kFloat32
                   : std::is_same_v<TestType, double>  ? DType::kFloat64
                   : std::is_same_v<TestType, int32_t> ? DType::kInt32
                   : std::is_same_v<TestType, int64_t> ? DType::kInt64
                                                       : DType::kUInt8;
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{15}, size_t{1023}, size_t{1024}, size_t{1025}, size_t{5000}}) {
    std::vector<std::vector<TestType>> src(5, std::vector<TestType>(n));
    for (int k = 0; k < 5; ++k) {
      for (size_t i = 0; i < n; ++i) src[k][i] = static_cast<TestType>((i * 7 + k * 13) % 29);
    }
    const void* ptrs[5];
    for (int k = 0; k < 5; ++k) ptrs[k] = src[k].data();
    std::vector<TestType> sum(n), mx(n), mn(n);
    reduce_sources(sum.data(), ptrs, 5, n, dt, ReduceOp::kSum);
    reduce_sources(mx.data(), ptrs, 5, n, dt, ReduceOp::kMax);
    reduce_sources(mn.data(), ptrs, 5, n, dt, ReduceOp::kMin);
    for (size_t i = 0; i < n; ++i) {
      TestType s = 0, hi = src[0][i], lo = src[0][i];
      for (int k = 0; k < 5; ++k) {
        s = static_cast<TestType>(s + src[k][i]);
        hi = std::max(hi, src[k][i]);
        lo = std::min(lo, src[k][i]);
      }
      REQUIRE(sum[i] == s);
      REQUIRE(mx[i] == hi);
      REQUIRE(mn[i] == lo);
    }
    // In place over the first source.
    reduce_sources(src[0].data(), ptrs, 5, n, dt, ReduceOp::kSum);
    CHECK(src[0] == sum);
  }
}

TEST_CASE("kernels refuse a divisor below one", "[reduce]") {
  float x = 1, y = 2;
  CHECK_THROWS_AS(reduce_into(&x, &y, 1, DType::kFloat32, ReduceOp::kAvg, 0), std::invalid_argument);
}
