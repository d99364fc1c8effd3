#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "device/device.h"
#include "kernels/reduce_cpu.h"

namespace hocc {
namespace {

// In front of the bytes handed out: the mapping's start and length (64 bytes, so the data stays aligned).
struct Header {
  void* base;
  size_t len;
};
constexpr size_t kHeader = 64;
// Buffers this large come in transparent huge pages where the kernel allows it (madvise mode): a fresh
// buffer is then a page fault per 2 MiB rather than per 4 KiB, which is most of what a call's fresh work
// buffer costs (the executor keeps only small ones between calls).
constexpr size_t kHuge = size_t(2) << 20;

}  // namespace

void* CpuDevice::alloc(size_t bytes) {
  const bool huge = bytes >= kHuge;
  const size_t len = kHeader + (bytes ? bytes : 1) + (huge ? kHuge : 0);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("hocc: cannot map " + std::to_string(bytes) + " bytes of host memory: " + std::strerror(errno));
  uintptr_t data = reinterpret_cast<uintptr_t>(p) + kHeader;
  if (huge) {
    data = (data + kHuge - 1) & ~(kHuge - 1);
    madvise(reinterpret_cast<void*>(data), bytes, MADV_HUGEPAGE);  // advice: where it is refused, small pages
  }
  *reinterpret_cast<Header*>(data - kHeader) = {p, len};
  return reinterpret_cast<void*>(data);
}

void CpuDevice::free(void* p) {
  if (!p) return;
  const Header h = *reinterpret_cast<const Header*>(static_cast<char*>(p) - kHeader);
  munmap(h.base, h.len);
}

void CpuDevice::reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void*) {
  reduce_cpu(dst, src, n, t, op);
}

void CpuDevice::zero(void* dst, size_t bytes, void*) {
  if (bytes) std::memset(dst, 0, bytes);
}

void CpuDevice::divide(void* dst, size_t n, DType t, double divisor, void*) { divide_cpu(dst, n, t, divisor); }

}  // namespace hocc
