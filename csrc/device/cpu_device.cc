#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "device/device.h"
#include "kernels/reduce_cpu.h"

namespace hocc {
namespace {

constexpr size_t kHeader = 64;  // the mapping's length, kept in front of the bytes handed out (64-byte aligned)

}  // namespace

void* CpuDevice::alloc(size_t bytes) {
  const size_t len = kHeader + (bytes ? bytes : 1);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("hocc: cannot map " + std::to_string(bytes) + " bytes of host memory: " + std::strerror(errno));
  *static_cast<size_t*>(p) = len;
  return static_cast<char*>(p) + kHeader;
}

void CpuDevice::free(void* p) {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHeader;
  munmap(base, *reinterpret_cast<size_t*>(base));
}

void CpuDevice::reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void*) {
  reduce_cpu(dst, src, n, t, op);
}

void CpuDevice::zero(void* dst, size_t bytes, void*) {
  if (bytes) std::memset(dst, 0, bytes);
}

void CpuDevice::divide(void* dst, size_t n, DType t, double divisor, void*) { divide_cpu(dst, n, t, divisor); }

}  // namespace hocc
