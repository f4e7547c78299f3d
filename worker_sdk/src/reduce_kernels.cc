#include "reduce_kernels.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#define DDPRUN_HAVE_AVX2_PATH 1
#define DDPRUN_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#endif

// Every loop below is a template inlined (always_inline) into two entry points per kernel: one compiled for
// the baseline ISA, one for AVX2+F16C, chosen once at run time. The loops are plain indexed loops over
// restrict-qualified arrays with no branches, which is what GCC's vectoriser wants. fp16 is the exception:
// GCC 12 does not vectorise _Float16 conversions, so fp16 goes through float tiles converted with F16C
// intrinsics (scalar conversions on the baseline path).
#define DDPRUN_INLINE [[gnu::always_inline]] inline

namespace ddprun::sdk {
namespace {

constexpr size_t kTile = 1024;

// ---- element types: storage S, accumulator A ------------------------------------------------------------
template <class T>
struct Plain {
  using S = T;
  using A = T;
  static constexpr bool kTiled = false;
  DDPRUN_INLINE static A load(S v) { return v; }
  DDPRUN_INLINE static S store(A v) { return v; }
};

struct BFloat {
  using S = uint16_t;
  using A = float;
  static constexpr bool kTiled = false;
  DDPRUN_INLINE static A load(S v) { return __builtin_bit_cast(float, static_cast<uint32_t>(v) << 16); }
  DDPRUN_INLINE static S store(A v) {
    uint32_t u = __builtin_bit_cast(uint32_t, v);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // round to nearest, ties to even
    uint32_t quiet_nan = (u >> 16) | 0x40u;
    bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    return static_cast<uint16_t>(nan ? quiet_nan : rounded);
  }
};

// fp16, converted a tile at a time (kTiled): load_tile/store_tile.
struct HalfScalar {
  using S = uint16_t;
  using A = float;
  static constexpr bool kTiled = true;
  DDPRUN_INLINE static A load(S v) { return static_cast<float>(__builtin_bit_cast(_Float16, v)); }
  DDPRUN_INLINE static S store(A v) { return __builtin_bit_cast(uint16_t, static_cast<_Float16>(v)); }
  DDPRUN_INLINE static void load_tile(const S* s, A* out, size_t m) {
    for (size_t i = 0; i < m; ++i) out[i] = load(s[i]);
  }
  DDPRUN_INLINE static void store_tile(const A* in, S* out, size_t m) {
    for (size_t i = 0; i < m; ++i) out[i] = store(in[i]);
  }
};

#ifdef DDPRUN_HAVE_AVX2_PATH
struct HalfF16C : HalfScalar {
  DDPRUN_TARGET_AVX2 static void load_tile(const S* s, A* out, size_t m) {
    size_t i = 0;
    for (; i + 8 <= m; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    }
    for (; i < m; ++i) out[i] = _cvtsh_ss(s[i]);
  }
  DDPRUN_TARGET_AVX2 static void store_tile(const A* in, S* out, size_t m) {
    size_t i = 0;
    for (; i + 8 <= m; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < m; ++i) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT);
  }
};
#endif

// ---- operations -----------------------------------------------------------------------------------------
struct Sum {
  template <class A>
  DDPRUN_INLINE static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {  // wrap around instead of signed overflow
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct Max {
  template <class A>
  DDPRUN_INLINE static A apply(A a, A b) {
    return a > b ? a : b;
  }
};
struct Min {
  template <class A>
  DDPRUN_INLINE static A apply(A a, A b) {
    return a < b ? a : b;
  }
};
struct NoOp {};  // divide_by

template <class A>
DDPRUN_INLINE A divide(A a, int d) {
  if constexpr (std::is_floating_point_v<A>) {
    return a / static_cast<A>(d);
  } else {
    using W = std::common_type_t<A, int>;
    return static_cast<A>(static_cast<W>(a) / static_cast<W>(d));
  }
}

// ---- loops ----------------------------------------------------------------------------------------------
struct IntoKernel {
  template <class T, class Op, bool kDiv>
  DDPRUN_INLINE static void run(void* dst, const void* src, size_t n, int div) {
    using S = typename T::S;
    using A = typename T::A;
    S* __restrict d = static_cast<S*>(dst);
    const S* __restrict s = static_cast<const S*>(src);
    if constexpr (T::kTiled) {
      alignas(64) A a[kTile], b[kTile];
      for (size_t base = 0; base < n; base += kTile) {
        const size_t m = std::min(kTile, n - base);
        T::load_tile(d + base, a, m);
        T::load_tile(s + base, b, m);
        for (size_t i = 0; i < m; ++i) {
          A x = Op::apply(a[i], b[i]);
          if constexpr (kDiv) x = divide(x, div);
          a[i] = x;
        }
        T::store_tile(a, d + base, m);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        auto a = Op::apply(T::load(d[i]), T::load(s[i]));
        if constexpr (kDiv) a = divide(a, div);
        d[i] = T::store(a);
      }
    }
  }
};

struct SourcesKernel {
  template <class T, class Op, bool kDiv>
  DDPRUN_INLINE static void run(void* dst, const void* const* srcs, int nsrc, size_t n, int div) {
    using S = typename T::S;
    using A = typename T::A;
    alignas(64) A acc[kTile];
    alignas(64) A tmp[T::kTiled ? kTile : 1];
    for (size_t base = 0; base < n; base += kTile) {
      const size_t m = std::min(kTile, n - base);
      const S* __restrict s0 = static_cast<const S*>(srcs[0]) + base;
      if constexpr (T::kTiled) {
        T::load_tile(s0, acc, m);
      } else {
        for (size_t i = 0; i < m; ++i) acc[i] = T::load(s0[i]);
      }
      for (int k = 1; k < nsrc; ++k) {
        const S* __restrict sk = static_cast<const S*>(srcs[k]) + base;
        if constexpr (T::kTiled) {
          T::load_tile(sk, tmp, m);
          for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], tmp[i]);
        } else {
          for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], T::load(sk[i]));
        }
      }
      if constexpr (kDiv) {
        for (size_t i = 0; i < m; ++i) acc[i] = divide(acc[i], div);
      }
      S* __restrict d = static_cast<S*>(dst) + base;
      if constexpr (T::kTiled) {
        T::store_tile(acc, d, m);
      } else {
        for (size_t i = 0; i < m; ++i) d[i] = T::store(acc[i]);
      }
    }
  }
};

struct DivideKernel {
  template <class T, class Op, bool kDiv>
  DDPRUN_INLINE static void run(void* data, size_t n, int div) {
    using S = typename T::S;
    using A = typename T::A;
    S* __restrict d = static_cast<S*>(data);
    if constexpr (T::kTiled) {
      alignas(64) A a[kTile];
      for (size_t base = 0; base < n; base += kTile) {
        const size_t m = std::min(kTile, n - base);
        T::load_tile(d + base, a, m);
        for (size_t i = 0; i < m; ++i) a[i] = divide(a[i], div);
        T::store_tile(a, d + base, m);
      }
    } else {
      for (size_t i = 0; i < n; ++i) d[i] = T::store(divide(T::load(d[i]), div));
    }
  }
};

// ---- dispatch (no lambdas: a lambda's body would not inherit the AVX2 target) ---------------------------
template <class K, class T, class Op, class... Args>
DDPRUN_INLINE void with_div(bool div, Args... args) {
  if (div) {
    K::template run<T, Op, true>(args...);
  } else {
    K::template run<T, Op, false>(args...);
  }
}

template <class K, class T, class... Args>
DDPRUN_INLINE void by_op(ReduceOp op, bool div, Args... args) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return with_div<K, T, Sum>(div, args...);
    case ReduceOp::kMax:
      return with_div<K, T, Max>(div, args...);
    case ReduceOp::kMin:
      return with_div<K, T, Min>(div, args...);
  }
  throw std::invalid_argument("unknown ReduceOp");
}

// op == nullopt-like: K is DivideKernel (no reduce op).
template <class K, class T, class... Args>
DDPRUN_INLINE void by_op_or_divide(ReduceOp op, bool div, Args... args) {
  if constexpr (std::is_same_v<K, DivideKernel>) {
    (void)op;
    (void)div;
    K::template run<T, NoOp, true>(args...);
  } else {
    by_op<K, T>(op, div, args...);
  }
}

template <class K, class HalfT, class... Args>
DDPRUN_INLINE void dispatch(DType t, ReduceOp op, bool div, Args... args) {
  switch (t) {
    case DType::kFloat32:
      return by_op_or_divide<K, Plain<float>>(op, div, args...);
    case DType::kFloat64:
      return by_op_or_divide<K, Plain<double>>(op, div, args...);
    case DType::kFloat16:
      return by_op_or_divide<K, HalfT>(op, div, args...);
    case DType::kBFloat16:
      return by_op_or_divide<K, BFloat>(op, div, args...);
    case DType::kInt32:
      return by_op_or_divide<K, Plain<int32_t>>(op, div, args...);
    case DType::kInt64:
      return by_op_or_divide<K, Plain<int64_t>>(op, div, args...);
    case DType::kUInt8:
      return by_op_or_divide<K, Plain<uint8_t>>(op, div, args...);
  }
  throw std::invalid_argument("unknown DType");
}

// ---- the two compilations -------------------------------------------------------------------------------
#ifdef DDPRUN_HAVE_AVX2_PATH
DDPRUN_TARGET_AVX2 __attribute__((flatten)) void into_avx2(void* d, const void* s, size_t n, DType t,
                                                           ReduceOp op, int div) {
  dispatch<IntoKernel, HalfF16C>(t, op, div != 1, d, s, n, div);
}
DDPRUN_TARGET_AVX2 __attribute__((flatten)) void sources_avx2(void* d, const void* const* s, int k, size_t n,
                                                              DType t, ReduceOp op, int div) {
  dispatch<SourcesKernel, HalfF16C>(t, op, div != 1, d, s, k, n, div);
}
DDPRUN_TARGET_AVX2 __attribute__((flatten)) void divide_avx2(void* d, size_t n, DType t, int div) {
  dispatch<DivideKernel, HalfF16C>(t, ReduceOp::kSum, true, d, n, div);
}

bool use_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
}
#endif

void into_generic(void* d, const void* s, size_t n, DType t, ReduceOp op, int div) {
  dispatch<IntoKernel, HalfScalar>(t, op, div != 1, d, s, n, div);
}
void sources_generic(void* d, const void* const* s, int k, size_t n, DType t, ReduceOp op, int div) {
  dispatch<SourcesKernel, HalfScalar>(t, op, div != 1, d, s, k, n, div);
}
void divide_generic(void* d, size_t n, DType t, int div) {
  dispatch<DivideKernel, HalfScalar>(t, ReduceOp::kSum, true, d, n, div);
}

void check_divisor(int divisor) {
  if (divisor < 1) throw std::invalid_argument("reduce kernels: divisor must be >= 1");
}

}  // namespace

void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op, int divisor) {
  check_divisor(divisor);
  if (count == 0) return;
#ifdef DDPRUN_HAVE_AVX2_PATH
  if (use_avx2()) return into_avx2(dst, src, count, dtype, op, divisor);
#endif
  into_generic(dst, src, count, dtype, op, divisor);
}

void reduce_sources(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                    int divisor) {
  check_divisor(divisor);
  if (nsrc < 1) throw std::invalid_argument("reduce_sources: no source");
  if (count == 0) return;
#ifdef DDPRUN_HAVE_AVX2_PATH
  if (use_avx2()) return sources_avx2(dst, srcs, nsrc, count, dtype, op, divisor);
#endif
  sources_generic(dst, srcs, nsrc, count, dtype, op, divisor);
}

void divide_by(void* data, size_t count, DType dtype, int divisor) {
  check_divisor(divisor);
  if (count == 0 || divisor == 1) return;
#ifdef DDPRUN_HAVE_AVX2_PATH
  if (use_avx2()) return divide_avx2(data, count, dtype, divisor);
#endif
  divide_generic(data, count, dtype, divisor);
}

float half_to_float(uint16_t h) {
  return HalfScalar::load(h);
}
uint16_t float_to_half(float f) {
  return HalfScalar::store(f);
}
float bfloat16_to_float(uint16_t b) {
  return BFloat::load(b);
}
uint16_t float_to_bfloat16(float f) {
  return BFloat::store(f);
}

}  // namespace ddprun::sdk
