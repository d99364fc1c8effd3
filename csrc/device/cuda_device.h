// One CUDA device: streams, events, and the reduction kernels of
// kernels/reduce_cuda.cu. Built only when CUDA is (HOCC_WITH_CUDA).
#pragma once

#include "device/device.h"

namespace hocc {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index);
  int index() const { return index_; }
  bool is_cuda() const override { return true; }
  void* new_stream() override;
  void free_stream(void* s) override;
  void* record(void* stream) override;
  void wait(void* stream, void* event) override;
  void free_event(void* e) override;
  void sync(void* stream) override;
  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void* stream) override;
  void zero(void* dst, size_t bytes, void* stream) override;
  void divide(void* dst, size_t n, DType t, double divisor, void* stream) override;

 private:
  void use() const;
  int index_;
};

}  // namespace hocc
