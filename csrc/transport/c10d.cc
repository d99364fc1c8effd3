#include "transport/c10d.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>
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
      const size_t bytes = count * dtype_size(t);
      if (tiny(bytes)) {
        tiny_gather(src, bytes);
        if (holds_all()) reduce_held(bytes, count, t, op, lane);
        tiny_broadcast(bytes);
        copy_in(mine_.data, dst, count, t, lane);
        return;
      }
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
      const size_t es = dtype_size(t), in = size_t(n) * seg * es;
      if (tiny(in)) {  // the root reduces every segment; each member keeps its own
        tiny_gather(src, in);
        if (holds_all()) reduce_held(in, size_t(n) * seg, t, op, lane);
        tiny_broadcast(in);
        copy_in(mine_.data + size_t(me) * seg * es, out, seg, t, lane);
        return;
      }
      agree();
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
      const size_t es = dtype_size(t);
      if (tiny(seg * es)) {
        tiny_gather(src, seg * es);
        tiny_broadcast(size_t(n) * seg * es);
        copy_in(mine_.data, dst, size_t(n) * seg, t, lane);
        return;
      }
      agree();
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
  // what a call check sends (fixed size: a check can never meet a receive of another size)
  struct Frame {
    CallId id;
    char data[kTinyBytes];
  };
  static_assert(sizeof(Frame) == kFrameBytes, "a frame is kFrameBytes");
  void exchange_here(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                     const Lane& lane) {
    const bool checking = check_begin();
    const size_t es = dtype_size(t);
    // a reduction receives beside, then reduces into place. On CPU every receive lands beside: an abort
    // wakes gloo's wait but leaves its receive posted, and a late message must not write into the
    // caller's tensor, which an all_reduce now works in and puts back on failure (executor.cc, Journal).
    // (No caller hands this comm's exchange a buffer in its scratch: reduce_scatter_out is gloo's own.)
    char* into = recv_n && (op != RedOp::none || device_.is_cpu()) ? scratch.at_least(recv_n * es, *lane.dev) : recv;
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
    mine_.id = *call;
    theirs_.id = CallId{};
    theirs_.id.magic = 0;
    std::vector<at::Tensor> s{bytes(&mine_)}, r{bytes(&theirs_)};
    hs_ = post("the call check", [&] { return pg_->send(s, next(), kCheckTag); });
    hr_ = post("the call check", [&] { return pg_->recv(r, prev(), kCheckTag); });
    return true;
  }
  void check_end() {
    finish(hr_, "the call check", "waiting for " + who(prev()) + " (the ring predecessor)");
    compare(prev(), " (the ring predecessor)", theirs_.id);
    agreed_ = mine_.id.seq;
  }
  void compare(int member, const char* role, const CallId& theirs) const {
    std::string d = differences(mine_.id, theirs);
    if (!d.empty())
      throw MismatchError("hocc: the ranks disagree on this call: " + who(member) + role + " is in " +
                          describe(theirs) + ", this rank in " + describe(mine_.id) + ": " + d +
                          ". Every rank must make the same collective calls in the same order with the same "
                          "sizes, dtypes and ops (HOCC_CHECK=1 compares every rank's call before any byte moves)");
  }
  void check_done() { finish(hs_, "the call check", "sending to " + who(next()) + " (the ring successor)"); }
  void agree() {
    if (check_begin()) {
      check_end();
      check_done();
    }
  }
  static at::Tensor bytes(Frame* f) { return at::from_blob(f, {int64_t(sizeof(Frame))}, at::kByte); }

  // Tiny calls. On CPU, a collective whose members' inputs all fit in one
  // frame (n x `bytes` <= kTinyBytes) runs as frames alone, over a binomial
  // tree rooted at the last member (member j's parent: j + lowbit(n-1-j)):
  // the inputs are gathered up the tree, the root reduces them in member
  // order, and the result goes back down, in 2 ceil(log2 n) steps. Every
  // frame carries the CallId and is compared where it lands, so the check
  // costs no round of its own; the check's ring edges that the tree lacks
  // get a frame each (tiny_gather), so a member in a call that is not tiny
  // is seen at once, however the group is split between the two kinds of
  // call. 2(n-1) + about n/2 messages: on 8 ranks 18, against 24 for Bruck's
  // all-gather (which this replaces: ceil(log2 n) steps, but with 8 ranks
  // sharing 2 cores each message is a wake-up; 2.3x gloo's time there) and
  // 14 for gloo's all-reduce of one element, which sends them one after
  // another. Two members exchange their frames at once: one step.
  bool tiny(size_t bytes) const { return device_.is_cpu() && n > 1 && size_t(n) * bytes <= kTinyBytes; }
  int root() const { return n - 1; }
  bool holds_all() const { return n == 2 || me == root(); }  // after tiny_gather
  static int lowbit(int x) { return x & -x; }
  // the members in member j's subtree: [j - subtree(j) + 1, j]
  int subtree(int j) const { return j == root() ? n : std::min(lowbit(root() - j), j + 1); }
  // mine_.data[0, bytes) = the reduction, in member order, of the `count` elements at mine_.data[q x bytes]
  void reduce_held(size_t bytes, size_t count, DType t, RedOp op, const Lane& lane) {
    for (int q = 1; q < n; ++q) lane.dev->reduce(mine_.data, mine_.data + size_t(q) * bytes, count, t, op, lane.stream);
  }
  // a frame from `from` into `f`, its CallId compared with ours
  void take(Frame& f, int from, const std::string& role) {
    f.id = CallId{};
    f.id.magic = 0;
    std::vector<at::Tensor> r{bytes(&f)};
    auto w = post("a tiny call", [&] { return pg_->recv(r, from, kCheckTag); });
    finish(w, "a tiny call", "waiting for " + who(from) + role);
    if (call) compare(from, role.c_str(), f.id);
  }
  // After tiny_gather, the root's mine_.data holds member q's input at q x len (and every member
  // the inputs of its subtree there; with two members, both hold both)
  void tiny_gather(const char* src, size_t len) {
    check_usable();
    mine_.id = call ? *call : CallId{};
    std::memcpy(mine_.data + size_t(me) * len, src, len);
    std::vector<at::Tensor> s{bytes(&mine_)};
    if (n == 2) {  // exactly the call check's exchange with the ring neighbour
      auto w = post("a tiny call", [&] { return pg_->send(s, next(), kCheckTag); });
      take(theirs_, prev(), " (the ring predecessor)");
      finish(w, "a tiny call", "sending to " + who(next()));
      std::memcpy(mine_.data + size_t(prev()) * len, theirs_.data + size_t(prev()) * len, len);
      return;
    }
    // The ring check's edges ride along: every member's first receive is its predecessor's frame (a
    // member with children: its first child's gather frame; a leaf: a frame of the predecessor's own),
    // and a member whose parent is not its successor sends that successor such a frame at once. So a
    // member in a call that is not tiny meets, at every edge between it and a tiny one, a frame that
    // waits on nobody: any split of the group between the two kinds of call is seen at once.
    const int parent = me == root() ? -1 : me + lowbit(root() - me);
    if (parent != next()) {
      ring_.id = mine_.id;
      std::vector<at::Tensor> rs{bytes(&ring_)};
      ring_send_ = post("a tiny call", [&] { return pg_->send(rs, next(), kCheckTag); });
    }
    const int reach = subtree(me);
    if (reach == 1) {  // a leaf: its gather frame leaves at once, then it takes its predecessor's frame
      auto w = post("a tiny call", [&] { return pg_->send(s, parent, kCheckTag); });
      take(theirs_, prev(), " (the ring predecessor)");
      finish(w, "a tiny call", "sending to " + who(parent));
      return;
    }
    for (int d = 1; d < reach; d *= 2) {  // d = 1 first: the predecessor
      const int kid = me - d;
      take(theirs_, kid, kid == prev() ? " (the ring predecessor)" : " (a tiny call's tree child)");
      const int lo = kid - subtree(kid) + 1;
      std::memcpy(mine_.data + size_t(lo) * len, theirs_.data + size_t(lo) * len, size_t(kid - lo + 1) * len);
    }
    if (parent >= 0) {
      auto w = post("a tiny call", [&] { return pg_->send(s, parent, kCheckTag); });
      finish(w, "a tiny call", "sending to " + who(parent));
    }
  }
  // the root's mine_.data[0, len) to every member's
  void tiny_broadcast(size_t len) {
    if (n == 2) {
      if (call) agreed_ = call->seq;
      return;
    }
    if (me != root()) {
      take(theirs_, me + lowbit(root() - me), " (a tiny call's tree parent)");
      std::memcpy(mine_.data, theirs_.data, len);
    }
    std::vector<at::Tensor> s{bytes(&mine_)};
    std::vector<c10::intrusive_ptr<c10d::Work>> sent;
    for (int d = 1; d < subtree(me); d *= 2) {
      const int kid = me - d;
      sent.push_back(post("a tiny call", [&] { return pg_->send(s, kid, kCheckTag); }));
    }
    for (size_t i = 0; i < sent.size(); ++i) finish(sent[i], "a tiny call", "sending to " + who(me - (1 << i)));
    finish(ring_send_, "a tiny call", "sending to " + who(next()) + " (the ring successor)");
    if (call) agreed_ = call->seq;
  }

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
  Frame mine_, theirs_;  // the call check's buffers, and a tiny call's
  Frame ring_;           // a tiny call's frame to the ring successor where that is not its tree parent
  c10::intrusive_ptr<c10d::Work> ring_send_;
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
