#pragma once
// A grow-only scratch buffer in its own anonymous mapping, for buffers that
// live as long as a communicator. Through malloc, a long-lived block of a few
// MiB lands in glibc's brk heap once its mmap threshold has risen (it rises to
// the largest block freed, up to 32 MiB), and there it keeps the heap from
// shrinking below it: fresh tensors of varying sizes then grow the heap call
// after call (issue 13's soak). A mapping of its own is returned whole on
// growth and on destruction, is zero pages until touched (no memset, unlike
// std::vector::resize), and nothing of the old contents is copied on growth.
#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "core/types.h"

namespace hocc {

class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { release(); }

  // at least `bytes` of scratch; earlier contents are not kept when it grows
  char* at_least(size_t bytes) {
    if (bytes <= size_) return data_;
    release();
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw Error("hocc: cannot map " + std::to_string(bytes) + " bytes of scratch: " + std::strerror(errno));
    data_ = static_cast<char*>(p);
    size_ = bytes;
    return data_;
  }

 private:
  void release() {
    if (data_) munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace hocc
