// Reduction kernels of the CPU backend: element-wise sum/max/min over raw buffers of every DType.
//
// Pure functions on memory (no threads, no I/O), written so GCC vectorises them; on x86-64 CPUs with AVX2
// and F16C a second compilation of the same loops is chosen at run time (fp16 conversions in hardware).
//
// Semantics, identical on every path so that all ranks get bit-identical results:
//  - kAvg reduces like kSum; the caller passes `divisor` (the group size) to the kernel that finishes the
//    reduction, which divides before the final rounding. Integer division truncates toward zero.
//  - Integer sums wrap around (two's complement), uint8 included.
//  - fp16 and bf16 are converted to float, combined in float and rounded to nearest-even once per kernel
//    call; NaN stays NaN, overflow gives infinity.
//  - max/min of floats with a NaN operand: unspecified which operand wins.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddprun/process_group.h"

namespace ddprun::sdk {

// dst[i] = op(dst[i], src[i]) / divisor, for i < count. dst and src must not overlap.
void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op, int divisor = 1);

// dst[i] = op(srcs[0][i], ..., srcs[nsrc-1][i]) / divisor, combined in source order. nsrc >= 1. dst may be
// one of the sources (it is written after all of them are read, tile by tile).
void reduce_sources(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                    int divisor = 1);

// data[i] /= divisor.
void divide_by(void* data, size_t count, DType dtype, int divisor);

// Scalar conversions (the kernels' rounding), exposed for tests and for programs that fill buffers.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace ddprun::sdk
