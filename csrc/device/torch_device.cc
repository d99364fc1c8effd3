// The device layer for GPUs: a device of torch's driven through c10's
// device-generic streams and events and ATen's kernels, so hocc has no GPU
// code of its own and links no CUDA library (torch's CUDA build brings it at
// run time; on a CPU-only torch, making a CUDA device raises). Streams are
// c10::Streams from torch's pool, handed out boxed; events are c10::Events.
// The only file of csrc/ that runs on the GPU alone: the CPU suite runs the rest.
#include "device/torch_device.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "device/device.h"

namespace hocc {

c10::ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::f32: return at::kFloat;
    case DType::f64: return at::kDouble;
    case DType::f16: return at::kHalf;
    case DType::bf16: return at::kBFloat16;
    case DType::i8: return at::kChar;
    case DType::u8: return at::kByte;
    case DType::i32: return at::kInt;
    case DType::i64: return at::kLong;
  }
  throw Error("hocc: unknown dtype");
}

at::Tensor view(const void* p, size_t count, DType t, c10::Device device) {
  // the device given, not looked up from the pointer (a driver call per view on CUDA, and an error for the
  // null pointer of an empty tensor)
  return at::for_blob(const_cast<void*>(p), {int64_t(count)})
      .options(at::TensorOptions().dtype(scalar_type(t)))
      .target_device(device)
      .make_tensor();
}

namespace {

class TorchDevice final : public Device {
 public:
  explicit TorchDevice(c10::Device d) : dev_(d), impl_(c10::impl::getDeviceGuardImpl(d.type())) {}
  bool is_cuda() const override { return dev_.is_cuda(); }

  void* new_stream() override {
    std::lock_guard<std::mutex> lk(mu_);
    return &streams_.emplace_back(impl_->getStreamFromGlobalPool(dev_));
  }
  void* record(void* stream) override {
    auto* e = new c10::Event(dev_.type());
    e->record(at(stream));
    return e;
  }
  void wait(void* stream, void* event) override {
    if (event) static_cast<c10::Event*>(event)->block(at(stream));
  }
  void free_event(void* e) override { delete static_cast<c10::Event*>(e); }
  void sync(void* stream) override { at(stream).synchronize(); }
  void on_stream(void* stream, const std::function<void()>& fn) override {
    c10::StreamGuard g(at(stream));
    fn();
  }

  void* alloc(size_t bytes) override {  // torch's caching allocator, on the current stream
    at::Tensor t = at::empty({int64_t(bytes ? bytes : 1)}, at::TensorOptions().dtype(at::kByte).device(dev_));
    std::lock_guard<std::mutex> lk(mu_);
    return owned_.emplace(t.data_ptr(), t).first->first;
  }
  void free(void* p) override {
    std::lock_guard<std::mutex> lk(mu_);
    owned_.erase(p);
  }

  void reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void* stream) override {
    if (!n) return;
    c10::StreamGuard g(at(stream));
    at::Tensor d = view(dst, n, t, dev_), s = view(src, n, t, dev_);
    switch (op) {
      case RedOp::none: d.copy_(s); break;
      case RedOp::sum: d.add_(s); break;
      case RedOp::prod: d.mul_(s); break;
      case RedOp::min: at::minimum_out(d, d, s); break;
      case RedOp::max: at::maximum_out(d, d, s); break;
    }
  }
  void zero(void* dst, size_t bytes, void* stream) override {
    if (!bytes) return;
    c10::StreamGuard g(at(stream));
    view(dst, bytes, DType::u8, dev_).zero_();
  }
  void divide(void* dst, size_t n, DType t, double divisor, void* stream) override {
    if (!n) return;
    c10::StreamGuard g(at(stream));
    at::Tensor d = view(dst, n, t, dev_);
    if (at::isIntegralType(d.scalar_type(), false)) {
      d.div_(static_cast<int64_t>(divisor), "trunc");  // integer AVG as NCCL's: toward zero, in the dtype
    } else {
      d.div_(divisor);
    }
  }

 private:
  c10::Stream at(void* stream) const { return stream ? *static_cast<c10::Stream*>(stream) : impl_->getStream(dev_); }

  const c10::Device dev_;
  const c10::impl::DeviceGuardImplInterface* impl_;
  std::mutex mu_;
  std::deque<c10::Stream> streams_;       // the lanes' pool streams, boxed (a deque keeps addresses)
  std::map<void*, at::Tensor> owned_;     // alloc()'s buffers, freed by dropping the tensor
};

}  // namespace

std::unique_ptr<Device> make_device(const std::string& name) {
  if (name == "cpu") return std::make_unique<CpuDevice>();
  c10::Device d(name);  // raises on a name torch does not know
  if (!d.has_index()) d.set_index(0);
  if (!c10::impl::hasDeviceGuardImpl(d.type()))
    throw Error("hocc: this build of torch has no " + c10::DeviceTypeName(d.type(), true) +
                " support, so hocc cannot run on " + name);
  return std::make_unique<TorchDevice>(d);
}

}  // namespace hocc
