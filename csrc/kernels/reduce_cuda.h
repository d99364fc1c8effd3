// Elementwise reductions on a CUDA device: the receive-reduce building block of
// ring steps over NCCL send/recv. float32, float16 and bfloat16 (computed in
// float), plus float64 and integers, for sum / product / min / max.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/types.h"

namespace hocc {

// dst = dst (op) src over n elements, enqueued on `stream`; op none copies.
void reduce_cuda(void* dst, const void* src, size_t n, DType t, RedOp op, cudaStream_t stream);

// dst /= divisor over n floating-point elements (AVG), enqueued on `stream`.
void divide_cuda(void* dst, size_t n, DType t, double divisor, cudaStream_t stream);

// Measured bandwidth (GB/s of bytes read + written) of reduce_cuda and of a
// device-to-device copy over buffers of `bytes`; for bench/gpu_check.sh.
struct KernelBandwidth {
  double reduce_gbps;
  double copy_gbps;
};
KernelBandwidth bench_reduce_cuda(size_t bytes, DType t, int iters);

}  // namespace hocc
