#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "kernels/reduce_cuda.h"

namespace hocc {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("hocc cuda: ") + what + ": " + cudaGetErrorString(e));
}

template <class T> struct Compute { using type = T; };
template <> struct Compute<__half> { using type = float; };
template <> struct Compute<__nv_bfloat16> { using type = float; };

template <class T> __device__ __forceinline__ typename Compute<T>::type widen(T v) { return v; }
template <> __device__ __forceinline__ float widen(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T narrow(typename Compute<T>::type v) { return v; }
template <> __device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <RedOp OP, class C>
__device__ __forceinline__ C apply(C a, C b) {
  if constexpr (OP == RedOp::sum) return a + b;
  else if constexpr (OP == RedOp::prod) return a * b;
  else if constexpr (OP == RedOp::min) return b < a ? b : a;
  else if constexpr (OP == RedOp::max) return a < b ? b : a;
  else return b;
}

// Vectorized main part: each thread moves 16 bytes at a time (grid-stride);
// the tail (and misaligned buffers) go element by element.
template <class T, RedOp OP>
__global__ void reduce_kernel(T* __restrict__ dst, const T* __restrict__ src, size_t n, bool vec) {
  constexpr int V = 16 / sizeof(T);
  const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t done = 0;
  if (vec) {
    const size_t nv = n / V;
    auto* d4 = reinterpret_cast<uint4*>(dst);
    const auto* s4 = reinterpret_cast<const uint4*>(src);
    for (size_t i = tid; i < nv; i += stride) {
      uint4 a = d4[i], b = s4[i];
      T* av = reinterpret_cast<T*>(&a);
      const T* bv = reinterpret_cast<const T*>(&b);
#pragma unroll
      for (int j = 0; j < V; ++j) av[j] = narrow<T>(apply<OP>(widen(av[j]), widen(bv[j])));
      d4[i] = a;
    }
    done = nv * V;
  }
  for (size_t i = done + tid; i < n; i += stride) dst[i] = narrow<T>(apply<OP>(widen(dst[i]), widen(src[i])));
}

template <class T, RedOp OP>
void launch(void* dst, const void* src, size_t n, cudaStream_t stream) {
  const bool vec = (reinterpret_cast<uintptr_t>(dst) % 16 == 0) && (reinterpret_cast<uintptr_t>(src) % 16 == 0);
  const int threads = 512;
  size_t work = vec ? n / (16 / sizeof(T)) + 1 : n;
  int blocks = int(std::min<size_t>((work + threads - 1) / threads, 2048));
  if (blocks < 1) blocks = 1;
  reduce_kernel<T, OP><<<blocks, threads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), n, vec);
  check(cudaGetLastError(), "reduce kernel launch");
}

template <RedOp OP>
void launch_op(void* dst, const void* src, size_t n, DType t, cudaStream_t s) {
  switch (t) {
    case DType::f32: return launch<float, OP>(dst, src, n, s);
    case DType::f64: return launch<double, OP>(dst, src, n, s);
    case DType::f16: return launch<__half, OP>(dst, src, n, s);
    case DType::bf16: return launch<__nv_bfloat16, OP>(dst, src, n, s);
    case DType::i8: return launch<int8_t, OP>(dst, src, n, s);
    case DType::u8: return launch<uint8_t, OP>(dst, src, n, s);
    case DType::i32: return launch<int32_t, OP>(dst, src, n, s);
    case DType::i64: return launch<int64_t, OP>(dst, src, n, s);
  }
}

template <class T>
__global__ void divide_kernel(T* dst, size_t n, float q) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += stride)
    dst[i] = narrow<T>(widen(dst[i]) / q);
}

__global__ void divide_kernel_f64(double* dst, size_t n, double q) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += stride) dst[i] /= q;
}

}  // namespace

void divide_cuda(void* dst, size_t n, DType t, double divisor, cudaStream_t s) {
  if (n == 0) return;
  const int threads = 512;
  const int blocks = int(std::min<size_t>((n + threads - 1) / threads, 2048));
  switch (t) {
    case DType::f32: divide_kernel<float><<<blocks, threads, 0, s>>>(static_cast<float*>(dst), n, float(divisor)); break;
    case DType::f16: divide_kernel<__half><<<blocks, threads, 0, s>>>(static_cast<__half*>(dst), n, float(divisor)); break;
    case DType::bf16:
      divide_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), n, float(divisor));
      break;
    case DType::f64: divide_kernel_f64<<<blocks, threads, 0, s>>>(static_cast<double*>(dst), n, divisor); break;
    default: throw Error(std::string("hocc: AVG needs a floating-point dtype, not ") + dtype_name(t));
  }
  check(cudaGetLastError(), "divide kernel launch");
}

void reduce_cuda(void* dst, const void* src, size_t n, DType t, RedOp op, cudaStream_t s) {
  if (n == 0) return;
  switch (op) {
    case RedOp::none:
      check(cudaMemcpyAsync(dst, src, n * dtype_size(t), cudaMemcpyDeviceToDevice, s), "copy");
      return;
    case RedOp::sum: return launch_op<RedOp::sum>(dst, src, n, t, s);
    case RedOp::prod: return launch_op<RedOp::prod>(dst, src, n, t, s);
    case RedOp::min: return launch_op<RedOp::min>(dst, src, n, t, s);
    case RedOp::max: return launch_op<RedOp::max>(dst, src, n, t, s);
  }
}

KernelBandwidth bench_reduce_cuda(size_t bytes, DType t, int iters) {
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "malloc");
  check(cudaMalloc(&b, bytes), "malloc");
  check(cudaMemset(a, 0, bytes), "memset");
  check(cudaMemset(b, 0, bytes), "memset");
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  const size_t n = bytes / dtype_size(t);
  auto time = [&](bool reduce) {
    if (reduce) reduce_cuda(a, b, n, t, RedOp::sum, s);  // warm-up
    else check(cudaMemcpyAsync(a, b, bytes, cudaMemcpyDeviceToDevice, s), "copy");
    check(cudaEventRecord(e0, s), "record");
    for (int i = 0; i < iters; ++i) {
      if (reduce) reduce_cuda(a, b, n, t, RedOp::sum, s);
      else check(cudaMemcpyAsync(a, b, bytes, cudaMemcpyDeviceToDevice, s), "copy");
    }
    check(cudaEventRecord(e1, s), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    return ms / 1e3 / iters;
  };
  double t_reduce = time(true), t_copy = time(false);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
  // reduce reads two buffers and writes one; a copy reads one and writes one
  return {3.0 * bytes / t_reduce / 1e9, 2.0 * bytes / t_copy / 1e9};
}

}  // namespace hocc
