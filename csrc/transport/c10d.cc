#include "transport/c10d.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/reduce_cpu.h"

namespace hocc {
namespace {

at::ScalarType scalar_type(DType t) {
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
  throw Error("hocc c10d: unknown dtype");
}

c10d::ReduceOp reduce_op(RedOp op) {
  switch (op) {
    case RedOp::sum: return c10d::ReduceOp::SUM;
    case RedOp::prod: return c10d::ReduceOp::PRODUCT;
    case RedOp::min: return c10d::ReduceOp::MIN;
    case RedOp::max: return c10d::ReduceOp::MAX;
    case RedOp::none: break;
  }
  throw Error("hocc c10d: no reduction op for a copy");
}

class C10dComm final : public Comm {
 public:
  C10dComm(c10::intrusive_ptr<c10d::Backend> pg, int me, int n) : Comm(me, n), pg_(std::move(pg)) {}

  void exchange(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                const Lane&) override {
    const size_t es = dtype_size(t);
    char* into = recv;
    if (op != RedOp::none && recv_n) {  // receive beside, then reduce into place
      if (scratch_.size() < recv_n * es) scratch_.resize(recv_n * es);
      into = scratch_.data();
    }
    guard("a ring step", [&] {
      std::vector<at::Tensor> s{view(send, send_n, t)}, r{view(into, recv_n, t)};
      c10::intrusive_ptr<c10d::Work> sw, rw;
      if (send_n) sw = pg_->send(s, (me + 1) % n, 0);
      if (recv_n) rw = pg_->recv(r, (me + n - 1) % n, 0);
      if (sw) sw->wait();
      if (rw) rw->wait();
    });
    if (into != recv) reduce_cpu(recv, into, recv_n, t, op);
  }

  void all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane&) override {
    if (src != dst) reduce_cpu(dst, src, count, t, RedOp::none);
    guard("all_reduce", [&] {
      std::vector<at::Tensor> ts{view(dst, count, t)};
      c10d::AllreduceOptions o;
      o.reduceOp = reduce_op(op);
      pg_->allreduce(ts, o)->wait();
    });
  }

  void reduce_scatter(const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane) override {
    reduce_scatter_out(src, dst + size_t(me) * seg * dtype_size(t), seg, t, op, lane);
  }

  void reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane&) override {
    const size_t es = dtype_size(t);
    // gloo must not read and write the same memory: an output inside the input goes beside first
    const bool inside = out < src + size_t(n) * seg * es && src < out + seg * es;
    char* into = out;
    if (inside) {
      if (scratch_.size() < seg * es) scratch_.resize(seg * es);
      into = scratch_.data();
    }
    guard("reduce_scatter", [&] {
      at::Tensor o = view(into, seg, t), i = view(src, size_t(n) * seg, t);
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = reduce_op(op);
      pg_->_reduce_scatter_base(o, i, opts)->wait();
    });
    if (inside) std::memcpy(out, into, seg * es);
  }

  void all_gather(const char* src, char* dst, size_t seg, DType t, const Lane&) override {
    const size_t es = dtype_size(t);
    const bool inside = src < dst + size_t(n) * seg * es && dst < src + seg * es;
    if (inside) {  // our own segment in place: gloo needs it apart
      if (scratch_.size() < seg * es) scratch_.resize(seg * es);
      std::memcpy(scratch_.data(), src, seg * es);
      src = scratch_.data();
    }
    guard("all_gather", [&] {
      at::Tensor o = view(dst, size_t(n) * seg, t), i = view(src, seg, t);
      pg_->_allgather_base(o, i)->wait();
    });
  }

 private:
  static at::Tensor view(const char* p, size_t count, DType t) {
    return at::from_blob(const_cast<char*>(p), {int64_t(count)}, at::TensorOptions().dtype(scalar_type(t)));
  }
  template <class F>
  void guard(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      throw Error(std::string("hocc: ") + what + " over " + pg_->getBackendName() + " (member " +
                  std::to_string(me) + " of " + std::to_string(n) + ") failed: " + e.what());
    }
  }

  c10::intrusive_ptr<c10d::Backend> pg_;
  std::vector<char> scratch_;
};

}  // namespace

std::shared_ptr<Comm> make_c10d_comm(pybind11::handle backend, int me, int n) {
  auto pg = pybind11::cast<c10::intrusive_ptr<c10d::Backend>>(backend);
  if (pg->getSize() != n || pg->getRank() != me)
    throw Error("hocc c10d: the backend is rank " + std::to_string(pg->getRank()) + " of " +
                std::to_string(pg->getSize()) + ", expected member " + std::to_string(me) + " of " +
                std::to_string(n));
  return std::make_shared<C10dComm>(std::move(pg), me, n);
}

}  // namespace hocc
