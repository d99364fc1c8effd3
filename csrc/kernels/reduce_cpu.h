// Elementwise reductions on host memory: the building block of the in-process
// and shared-memory transports. Loops are plain so the compiler vectorizes them;
// float16/bfloat16 are computed in float and rounded to nearest-even once per
// op, as torch does.
#pragma once

#include <cstddef>

#include "core/types.h"

namespace hocc {

// dst = dst (op) src elementwise; op none copies.
void reduce_cpu(void* dst, const void* src, size_t n, DType dtype, RedOp op);

// dst = srcs[0] (op) srcs[1] (op) ... ; dst may be one of srcs. Works in
// cache-sized blocks so dst is read and written once.
void reduce_cpu_many(void* dst, const void* const* srcs, int nsrc, size_t n, DType dtype, RedOp op);

// dst /= divisor elementwise (AVG): fp16 and bf16 divide in float and round
// once, as torch does; integers divide as C does (toward zero), as NCCL's AVG.
void divide_cpu(void* dst, size_t n, DType dtype, double divisor);

}  // namespace hocc
