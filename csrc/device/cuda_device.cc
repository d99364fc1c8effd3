#include "device/cuda_device.h"

#include <cuda_runtime.h>

#include <string>

#include "kernels/reduce_cuda.h"

namespace hocc {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("hocc cuda: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

CudaDevice::CudaDevice(int index) : index_(index) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (index < 0 || index >= count)
    throw Error("hocc cuda: device " + std::to_string(index) + " does not exist (" + std::to_string(count) +
                " visible)");
}

void CudaDevice::use() const { check(cudaSetDevice(index_), "cudaSetDevice"); }

void* CudaDevice::new_stream() {
  use();
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}

void CudaDevice::free_stream(void* s) { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }

void* CudaDevice::record(void* stream) {
  use();
  cudaEvent_t e;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(e, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  return e;
}

void CudaDevice::wait(void* stream, void* event) {
  if (event) check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
                   "cudaStreamWaitEvent");
}

void CudaDevice::free_event(void* e) {
  if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void CudaDevice::sync(void* stream) {
  use();
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

void* CudaDevice::alloc(size_t bytes) {
  use();
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}

void CudaDevice::free(void* p) {
  if (p) cudaFree(p);
}

void CudaDevice::reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void* stream) {
  use();
  reduce_cuda(dst, src, n, t, op, static_cast<cudaStream_t>(stream));
}

void CudaDevice::zero(void* dst, size_t bytes, void* stream) {
  use();
  if (bytes) check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

void CudaDevice::divide(void* dst, size_t n, DType t, double divisor, void* stream) {
  use();
  divide_cuda(dst, n, t, divisor, static_cast<cudaStream_t>(stream));
}

}  // namespace hocc
