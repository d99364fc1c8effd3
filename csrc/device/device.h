// Where bytes live and how local work is done on them: host memory (CpuDevice)
// or one CUDA device (CudaDevice, device/cuda_device.h). Transports move data
// between ranks; devices copy and reduce locally, on a stream (CUDA) or at once.
#pragma once

#include <cstddef>

#include "core/types.h"

namespace hocc {

class Device {
 public:
  virtual ~Device() = default;
  virtual bool is_cuda() const = 0;
  // streams and events are opaque (cudaStream_t / cudaEvent_t); null on CPU
  virtual void* new_stream() { return nullptr; }
  virtual void free_stream(void*) {}
  virtual void* record(void* /*stream*/) { return nullptr; }
  virtual void wait(void* /*stream*/, void* /*event*/) {}
  virtual void free_event(void*) {}
  virtual void sync(void* /*stream*/) {}
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
  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void* stream) override;
  void zero(void* dst, size_t bytes, void* stream) override;
  void divide(void* dst, size_t n, DType t, double divisor, void* stream) override;
};

}  // namespace hocc
