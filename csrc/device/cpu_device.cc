#include <cstdlib>
#include <cstring>

#include "device/device.h"
#include "kernels/reduce_cpu.h"

namespace hocc {

void* CpuDevice::alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, ((bytes + 63) / 64) * 64 + 64);
  if (!p) throw Error("hocc: out of host memory");
  return p;
}

void CpuDevice::free(void* p) { std::free(p); }

void CpuDevice::reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void*) {
  reduce_cpu(dst, src, n, t, op);
}

void CpuDevice::zero(void* dst, size_t bytes, void*) {
  if (bytes) std::memset(dst, 0, bytes);
}

void CpuDevice::divide(void* dst, size_t n, DType t, double divisor, void*) { divide_cpu(dst, n, t, divisor); }

}  // namespace hocc
