#include "transport/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>

#include "kernels/reduce_cuda.h"

namespace hocc {
namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("hocc nccl: ") + what + ": " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i8: return ncclInt8;
    case DType::u8: return ncclUint8;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(RedOp op) {
  switch (op) {
    case RedOp::prod: return ncclProd;
    case RedOp::min: return ncclMin;
    case RedOp::max: return ncclMax;
    default: return ncclSum;
  }
}

std::string members(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "]";
}

// One communicator's ops. Each NCCL call goes through call(): under the
// watchdog's lock (never beside an abort), with ncclInProgress waited out and
// an event recorded after it, so that a run that does not finish names its step.
class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, int me, int n, CudaDevice& dev, NcclWatchdog& wd, std::string where)
      : Comm(me, n), comm_(comm), dev_(dev), wd_(wd), where_(std::move(where)) {}
  ~NcclComm() override {
    if (scratch_) dev_.free(scratch_);
  }

  void all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane) override {
    call("ncclAllReduce", count, t, lane,
         [&](cudaStream_t s) { return ncclAllReduce(src, dst, count, nccl_type(t), nccl_op(op), comm_, s); });
  }
  void reduce_scatter(const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane) override {
    // with src == dst this is NCCL's in-place form: the output is our own segment of the input
    reduce_scatter_out(src, dst + size_t(me) * seg * dtype_size(t), seg, t, op, lane);
  }
  void reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane) override {
    call("ncclReduceScatter", seg, t, lane,
         [&](cudaStream_t s) { return ncclReduceScatter(src, out, seg, nccl_type(t), nccl_op(op), comm_, s); });
  }
  void all_gather(const char* src, char* dst, size_t seg, DType t, const Lane& lane) override {
    call("ncclAllGather", seg, t, lane,
         [&](cudaStream_t s) { return ncclAllGather(src, dst, seg, nccl_type(t), comm_, s); });
  }
  void exchange(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                const Lane& lane) override {
    cudaStream_t s = stream(lane);
    const size_t bytes = recv_n * dtype_size(t);
    char* into = recv;
    if (op != RedOp::none && recv_n) {  // receive beside, then reduce into place
      if (bytes > scratch_bytes_) {
        if (scratch_) dev_.free(scratch_);  // cudaFree waits for the device: growth is rare
        scratch_ = static_cast<char*>(dev_.alloc(bytes));
        scratch_bytes_ = bytes;
      }
      into = scratch_;
    }
    call("ncclSend/ncclRecv", std::max(send_n, recv_n), t, lane, [&](cudaStream_t st) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      if (send_n) r = ncclSend(send, send_n, nccl_type(t), (me + 1) % n, comm_, st);
      if (r == ncclSuccess && recv_n) r = ncclRecv(into, recv_n, nccl_type(t), (me + n - 1) % n, comm_, st);
      ncclResult_t end = ncclGroupEnd();  // always close the group
      return r != ncclSuccess ? r : end;
    });
    if (into != recv) reduce_cuda(recv, into, recv_n, t, op, s);
  }

 private:
  static cudaStream_t stream(const Lane& lane) { return static_cast<cudaStream_t>(lane.stream); }
  template <class F>
  void call(const char* what, size_t count, DType t, const Lane& lane, F&& enqueue) {
    auto lk = wd_.lock();  // raises at once once the transport was aborted
    ncclResult_t r = enqueue(stream(lane));
    wd_.settle(lk, comm_, r, std::string(what) + " of " + std::to_string(count) + " " + dtype_name(t) + " in " + where_,
               lane.stream);
  }
  ncclComm_t comm_;  // owned by the watchdog
  CudaDevice& dev_;
  NcclWatchdog& wd_;
  std::string where_;
  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::string nccl_version() {
  int v = 0;
  check(ncclGetVersion(&v), "ncclGetVersion");
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string NcclTransport::unique_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof(id.internal));
}

NcclTransport::NcclTransport(const std::string& id, int rank, int size, int device, double timeout_s,
                             const std::string& name, OnError on_error)
    : rank_(rank),
      size_(size),
      timeout_s_(timeout_s),
      name_((name.empty() ? std::string() : "group " + name + ", ") + "rank " + std::to_string(rank) + " of " +
            std::to_string(size)),
      device_(device) {
  ncclUniqueId uid;
  if (id.size() != sizeof(uid.internal))
    throw Error("hocc nccl: a unique id has " + std::to_string(sizeof(uid.internal)) + " bytes, got " +
                std::to_string(id.size()));
  std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
  if (cudaSetDevice(device) != cudaSuccess) throw Error("hocc nccl: cannot use CUDA device " + std::to_string(device));
  watchdog_ = std::make_unique<NcclWatchdog>(device, timeout_s, name_, on_error);
  // nonblocking, so that a rank that never joins costs a timeout, not a hang
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = nullptr;
  const auto until = watchdog_->deadline();
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, uid, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm) ncclCommAbort(comm);
    check(r, "ncclCommInitRankConfig");
  }
  watchdog_->adopt(comm, "ncclCommInitRankConfig over " + std::to_string(size) + " ranks", until);
  parent_ = comm;
  world_ = std::make_unique<NcclComm>(comm, rank, size, device_, *watchdog_,
                                      "the whole group (member " + std::to_string(rank) + " of " +
                                          std::to_string(size) + ")");
}

NcclTransport::~NcclTransport() {
  watchdog_.reset();  // drains or aborts every communicator first: freeing scratch waits for the device
  comms_.clear();
  world_.reset();
}

void NcclTransport::begin(void* caller_stream, const std::string& what) { watchdog_->begin(caller_stream, what); }
void NcclTransport::end(void* caller_stream, bool enqueued) { watchdog_->end(caller_stream, enqueued); }
void NcclTransport::wait() { watchdog_->wait(); }

void* NcclTransport::split(void* parent, int color, int key, const std::string& what) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  // a nonblocking split writes the new communicator when it completes, which may be after a
  // timeout made us give up: the slot lives on the heap and is leaked in that case
  auto* slot = new ncclComm_t(nullptr);
  {
    auto lk = watchdog_->lock();
    ncclResult_t r = ncclCommSplit(static_cast<ncclComm_t>(parent), color, key, slot, &cfg);
    watchdog_->settle(lk, parent, r, what, nullptr);  // the split completes on the parent
  }
  ncclComm_t sub = *slot;
  delete slot;
  if (sub) watchdog_->adopt(sub, what, watchdog_->deadline());
  return sub;
}

Comm& NcclTransport::world() { return *world_; }

namespace {

bool is_whole(const std::vector<int>& ranks, int size) {
  if (int(ranks.size()) != size) return false;
  for (int i = 0; i < size; ++i)
    if (ranks[i] != i) return false;
  return true;
}

// a stage's groups as layers of disjoint groups (one ncclCommSplit each): a rank
// may sit in several groups of a step (unequal hosts), never twice in a layer
std::vector<std::vector<std::vector<int>>> layers(std::vector<std::vector<int>> groups) {
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  std::vector<std::vector<std::vector<int>>> out;
  std::vector<std::set<int>> used;
  for (auto& g : groups) {
    size_t l = 0;
    for (; l < out.size(); ++l)
      if (std::none_of(g.begin(), g.end(), [&](int r) { return used[l].count(r); })) break;
    if (l == out.size()) out.emplace_back(), used.emplace_back();
    used[l].insert(g.begin(), g.end());
    out[l].push_back(g);
  }
  return out;
}

}  // namespace

void NcclTransport::prepare(const Plan& plan) {
  watchdog_->lock();  // raises at once on an aborted transport
  // one split per (stage, layer of disjoint groups): every rank walks the same plans
  // in the same order and calls ncclCommSplit for the same partitions, as it is collective
  std::map<int, std::vector<std::vector<int>>> parts;
  for (const Step& s : plan.steps)
    for (const GroupSlice& g : s.groups)
      if (g.ranks.size() > 1 && !is_whole(g.ranks, size_)) parts[s.stage].push_back(g.ranks);
  for (auto& [stage, all] : parts)
    for (auto& groups : layers(all)) {
      auto key = std::make_pair(stage, groups);
      if (splits_.count(key)) continue;
      int color = NCCL_SPLIT_NOCOLOR, me = 0;
      const std::vector<int>* mine = nullptr;
      for (size_t i = 0; i < groups.size(); ++i)
        for (size_t j = 0; j < groups[i].size(); ++j)
          if (groups[i][j] == rank_) color = int(i), me = int(j), mine = &groups[i];
      std::string what = "ncclCommSplit for stage " + std::to_string(stage) + " (" + std::to_string(groups.size()) +
                         " groups" + (mine ? ", ours " + members(*mine) : std::string(", none ours")) + ")";
      auto* sub = static_cast<ncclComm_t>(split(parent_, color, me, what));
      splits_.insert(key);
      if (!mine) continue;
      auto ckey = std::make_pair(stage, *mine);
      if (comms_.count(ckey)) {  // every member met this group first in the same earlier split: keep that one
        watchdog_->release(sub);
        continue;
      }
      comms_.emplace(ckey, std::make_unique<NcclComm>(sub, me, int(mine->size()), device_, *watchdog_,
                                                      "stage " + std::to_string(stage) + " group " + members(*mine) +
                                                          " (member " + std::to_string(me) + " of " +
                                                          std::to_string(mine->size()) + ")"));
    }
}

Comm& NcclTransport::comm(int stage, const std::vector<int>& ranks, Impl) {
  if (is_whole(ranks, size_)) return *world_;  // the whole group in rank order: the parent communicator
  auto it = comms_.find({stage, ranks});
  if (it == comms_.end()) throw Error("hocc nccl: no communicator for a group of stage " + std::to_string(stage) +
                                      "; prepare() the plan first");
  return *it->second;
}

void NcclTransport::abort(const std::string& why) { watchdog_->fail("aborted by this rank: " + why); }

}  // namespace hocc
