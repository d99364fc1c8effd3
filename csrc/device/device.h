// Where bytes live and how local work is done on them: host memory (CpuDevice)
// or a device of torch's, such as a CUDA GPU (device/torch_device.h: streams,
// events and ATen's kernels, so hocc has no GPU code of its own). Transports
// move data between ranks; devices copy and reduce locally, on a stream (CUDA)
// or at once.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/types.h"

namespace hocc {

class Device {
 public:
  virtual ~Device() = default;
  virtual bool is_cuda() const = 0;
  // streams and events are opaque handles; null on CPU. A null stream is the
  // calling thread's current stream (torch's, for a torch device). Streams
  // belong to the device (a torch device's come from torch's pool).
  virtual void* new_stream() { return nullptr; }
  virtual void* record(void* /*stream*/) { return nullptr; }
  virtual void wait(void* /*stream*/, void* /*event*/) {}
  virtual void free_event(void*) {}
  virtual void sync(void* /*stream*/) {}
  // fn with `stream` as the thread's current stream (where torch's ops and
  // c10d's collectives are ordered); on CPU fn just runs
  virtual void on_stream(void* /*stream*/, const std::function<void()>& fn) { fn(); }
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  // dst = dst (op) src over n elements, op none copies; ordered on `stream`
  virtual void reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void* stream) = 0;
  virtual void zero(void* dst, size_t bytes, void* stream) = 0;
  // dst /= divisor over n floating-point elements (AVG), ordered on `stream`
  virtual void divide(void* dst, size_t n, DType t, double divisor, void* stream) = 0;
};

class CpuDevice final : public Device {
 public:
  bool is_cuda() const override { return false; }
  // an anonymous mapping of its own (see Scratch): returned whole on free
  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void* stream) override;
  void zero(void* dst, size_t bytes, void* stream) override;
  void divide(void* dst, size_t n, DType t, double divisor, void* stream) override;
};

// "cpu", or a device of torch's such as "cuda:0" (device/torch_device.cc)
std::unique_ptr<Device> make_device(const std::string& name);

// A grow-only scratch buffer on a device, for buffers that live as long as a
// communicator. On the host each is a mapping of its own (CpuDevice::alloc):
// through malloc, a long-lived block of a few MiB lands in glibc's brk heap
// once its mmap threshold has risen (to the largest block freed, up to 32
// MiB), and there it keeps the heap from shrinking below it, so fresh tensors
// of varying sizes grow the heap call after call (issue 13's soak). Earlier
// contents are not kept when it grows.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { release(); }
  char* at_least(size_t bytes, Device& dev) {
    if (bytes <= size_ && dev_ == &dev) return data_;
    release();
    data_ = static_cast<char*>(dev.alloc(bytes));
    dev_ = &dev, size_ = bytes;
    return data_;
  }
  size_t size() const { return size_; }
  void release() {
    if (data_) dev_->free(data_);
    data_ = nullptr, dev_ = nullptr, size_ = 0;
  }

 private:
  Device* dev_ = nullptr;
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace hocc
