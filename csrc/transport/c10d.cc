#include "transport/c10d.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "device/torch_device.h"
#include "transport/ring.h"

namespace hocc {
namespace {

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

// A Comm over a c10d backend: gloo's sub-groups on CPU, NCCL's on GPUs. One
// code path for both: buffers are tensors on the comm's device, every op runs
// with the lane's stream current (c10d orders its work after that stream's,
// and Work::wait() orders the stream after the work without blocking the host
// on NCCL), and copies and reductions go through the lane's device.
// On a CPU backend, before a call's first op on it, members trade CallIds with
// their ring neighbours (kCheckTag, fixed size): ring steps only ever talk to
// neighbours, so once each member has checked its predecessor no message of
// the call can meet a receive of another size (which gloo answers by aborting
// the process). NCCL carries no host bytes, so there HOCC_CHECK=all is the
// check. Point-to-point waits can be woken by abort(); the backend's own
// collectives end at the group's timeout (torch's watchdog, for NCCL).
// the call check's tag: apart from the data (tag 0) and from any tag a caller
// plausibly uses for its own send/recv on a group whose backend hocc shares
constexpr int kCheckTag = 0x686f6363;  // "hocc"

class C10dComm final : public Comm {
 public:
  C10dComm(c10::intrusive_ptr<c10d::Backend> pg, int me, int n, c10::Device device)
      : Comm(me, n), pg_(std::move(pg)), device_(device) {}

  void exchange(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                const Lane& lane) override {
    lane.dev->on_stream(lane.stream, [&] { exchange_here(send, send_n, recv, recv_n, t, op, lane); });
  }

  void all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane) override {
    lane.dev->on_stream(lane.stream, [&] {
      agree();
      copy_in(src, dst, count, t, lane);
      collective("all_reduce", [&] {
        std::vector<at::Tensor> ts{tensor(dst, count, t)};
        c10d::AllreduceOptions o;
        o.reduceOp = reduce_op(op);
        return pg_->allreduce(ts, o);
      });
    });
  }

  void reduce_scatter(const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane) override {
    reduce_scatter_out(src, dst + size_t(me) * seg * dtype_size(t), seg, t, op, lane);
  }

  void reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane) override {
    lane.dev->on_stream(lane.stream, [&] {
      agree();
      const size_t es = dtype_size(t);
      // gloo must not read and write the same memory: an output inside the input goes beside first
      const bool inside = out < src + size_t(n) * seg * es && src < out + seg * es;
      char* into = inside ? scratch.at_least(seg * es, *lane.dev) : out;
      collective("reduce_scatter", [&] {
        at::Tensor o = tensor(into, seg, t), i = tensor(src, size_t(n) * seg, t);
        c10d::ReduceScatterOptions opts;
        opts.reduceOp = reduce_op(op);
        return pg_->_reduce_scatter_base(o, i, opts);
      });
      copy_in(into, out, seg, t, lane);
    });
  }

  void all_gather(const char* src, char* dst, size_t seg, DType t, const Lane& lane) override {
    lane.dev->on_stream(lane.stream, [&] {
      agree();
      const size_t es = dtype_size(t);
      if (src < dst + size_t(n) * seg * es && dst < src + seg * es) {  // our own segment in place: apart first
        char* apart = scratch.at_least(seg * es, *lane.dev);
        copy_in(src, apart, seg, t, lane);
        src = apart;
      }
      collective("all_gather", [&] {
        at::Tensor o = tensor(dst, size_t(n) * seg, t), i = tensor(src, seg, t);
        return pg_->_allgather_base(o, i);
      });
    });
  }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? "aborted" : why;
    for (auto& w : inflight_) w->abort();  // gloo wakes the waiter, which then sees aborted_
  }

 private:
  void exchange_here(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                     const Lane& lane) {
    const bool checking = check_begin();
    const size_t es = dtype_size(t);
    // a reduction receives beside, then reduces into place
    char* into = op != RedOp::none && recv_n ? scratch.at_least(recv_n * es, *lane.dev) : recv;
    // our data may leave at once: the successor only takes it once it has checked our call id
    std::vector<at::Tensor> s{tensor(send, send_n, t)}, r{tensor(into, recv_n, t)};
    c10::intrusive_ptr<c10d::Work> sw, rw;
    if (!device_.is_cpu()) {
      // NCCL: a send and a receive enqueued apart can wait on each other across ranks; grouped
      // (ncclGroupStart/End, through c10d's coalescing) they cannot, and one work covers both
      rw = post("a ring step", [&] {
        pg_->startCoalescing();
        if (send_n) pg_->send(s, next(), 0);
        if (recv_n) pg_->recv(r, prev(), 0);
        return pg_->endCoalescing();
      });
    } else {  // gloo's are independent; the call check (CPU only) goes between them
      if (send_n) sw = post("a ring step", [&] { return pg_->send(s, next(), 0); });
      if (checking) check_end();
      if (recv_n) rw = post("a ring step", [&] { return pg_->recv(r, prev(), 0); });
    }
    // the receive first: its end is what the recorder times the link by (a send into a slow link
    // may end later, and must not be charged to the link we receive on)
    finish(rw, "a ring step", "waiting for " + who(prev()) + " (the ring predecessor)");
    recv_done_ns = wall_ns();
    finish(sw, "a ring step", "sending to " + who(next()) + " (the ring successor)");
    check_done();
    if (into != recv) lane.dev->reduce(recv, into, recv_n, t, op, lane.stream);
  }

  at::Tensor tensor(const char* p, size_t count, DType t) const { return view(p, count, t, device_); }
  int next() const { return (me + 1) % n; }
  int prev() const { return (me + n - 1) % n; }

  bool aborted() {
    std::lock_guard<std::mutex> lk(mu_);
    return !aborted_.empty();
  }
  void check_usable() {
    std::lock_guard<std::mutex> lk(mu_);
    if (!aborted_.empty()) throw Error("hocc: this communicator was aborted earlier (" + aborted_ + ")");
  }

  // The call check, around a call's first op here: post our call id to the
  // successor and the predecessor's receive (begin), take it before any data
  // of the call is received (end), and see our send through before the id
  // can change (done). Collectives do all three before they start (agree).
  bool check_begin() {
    check_usable();
    if (!call || !device_.is_cpu() || call->seq == agreed_) return false;
    mine_ = *call;
    theirs_ = CallId{};
    theirs_.magic = 0;
    std::vector<at::Tensor> s{bytes(&mine_)}, r{bytes(&theirs_)};
    hs_ = post("the call check", [&] { return pg_->send(s, next(), kCheckTag); });
    hr_ = post("the call check", [&] { return pg_->recv(r, prev(), kCheckTag); });
    return true;
  }
  void check_end() {
    finish(hr_, "the call check", "waiting for " + who(prev()) + " (the ring predecessor)");
    std::string d = differences(mine_, theirs_);
    if (!d.empty())
      throw MismatchError("hocc: the ranks disagree on this call: " + who(prev()) + " (the ring predecessor) is in " +
                          describe(theirs_) + ", this rank in " + describe(mine_) + ": " + d +
                          ". Every rank must make the same collective calls in the same order with the same "
                          "sizes, dtypes and ops (HOCC_CHECK=1 compares every rank's call before any byte moves)");
    agreed_ = mine_.seq;
  }
  void check_done() { finish(hs_, "the call check", "sending to " + who(next()) + " (the ring successor)"); }
  void agree() {
    if (check_begin()) {
      check_end();
      check_done();
    }
  }
  static at::Tensor bytes(CallId* c) { return at::from_blob(c, {int64_t(sizeof(CallId))}, at::kByte); }

  // a point-to-point op, tracked so that abort() can wake its wait
  template <class F>
  c10::intrusive_ptr<c10d::Work> post(const char* what, F&& start) {
    c10::intrusive_ptr<c10d::Work> w;
    try {
      w = start();
    } catch (const std::exception& e) {
      fail(what, "", e.what());
    }
    std::lock_guard<std::mutex> lk(mu_);
    if (!aborted_.empty()) w->abort();
    inflight_.push_back(w);
    return w;
  }
  // wait for a posted op (if any) and forget it
  void finish(c10::intrusive_ptr<c10d::Work>& w, const char* what, const std::string& stage) {
    if (!w) return;
    auto work = std::move(w);
    w.reset();
    std::string error;
    try {
      work->wait();
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      inflight_.erase(std::remove(inflight_.begin(), inflight_.end(), work), inflight_.end());
    }
    if (!error.empty()) fail(what, stage, error.c_str());
    if (aborted()) fail(what, stage, "");  // an abort woke the wait, which then returned quietly
  }

  template <class F>
  void collective(const char* what, F&& start) {
    try {
      start()->wait();
    } catch (const std::exception& e) {
      fail(what, "", e.what());
    }
  }

  [[noreturn]] void fail(const char* what, const std::string& stage, const char* why) {
    std::string aborted;
    {
      std::lock_guard<std::mutex> lk(mu_);
      aborted = aborted_;
    }
    std::string where = std::string(what) + " over " + pg_->getBackendName() + " among ranks [" + list() + "]";
    if (!aborted.empty()) throw Error("hocc: " + where + " was aborted: " + aborted);
    throw Error("hocc: " + where + (stage.empty() ? "" : ", " + stage) + ", failed: " + why);
  }
  std::string list() const {
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + (i < int(ranks.size()) ? std::to_string(ranks[i]) : "?");
    return s;
  }

  c10::intrusive_ptr<c10d::Backend> pg_;
  const c10::Device device_;
  uint64_t agreed_ = ~uint64_t(0);  // the last call checked with the predecessor
  CallId mine_, theirs_;             // the call check's buffers
  c10::intrusive_ptr<c10d::Work> hs_, hr_;
  std::mutex mu_;
  std::string aborted_;
  std::vector<c10::intrusive_ptr<c10d::Work>> inflight_;  // point-to-point works abort() can wake
};

}  // namespace

std::shared_ptr<Comm> make_c10d_comm(pybind11::handle backend, int me, int n, const std::string& device) {
  auto pg = pybind11::cast<c10::intrusive_ptr<c10d::Backend>>(backend);
  if (pg->getSize() != n || pg->getRank() != me)
    throw Error("hocc c10d: the backend is rank " + std::to_string(pg->getRank()) + " of " +
                std::to_string(pg->getSize()) + ", expected member " + std::to_string(me) + " of " +
                std::to_string(n));
  return std::make_shared<C10dComm>(std::move(pg), me, n, c10::Device(device));
}

}  // namespace hocc
