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

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, int me, int n, CudaDevice& dev, bool owned)
      : Comm(me, n), comm_(comm), dev_(dev), owned_(owned) {}
  ~NcclComm() override {
    if (scratch_) dev_.free(scratch_);
    if (owned_) ncclCommDestroy(comm_);
  }

  void all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane) override {
    check(ncclAllReduce(src, dst, count, nccl_type(t), nccl_op(op), comm_, stream(lane)), "ncclAllReduce");
  }
  void reduce_scatter(const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane) override {
    // with src == dst this is NCCL's in-place form: the output is our own segment of the input
    reduce_scatter_out(src, dst + size_t(me) * seg * dtype_size(t), seg, t, op, lane);
  }
  void reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane) override {
    check(ncclReduceScatter(src, out, seg, nccl_type(t), nccl_op(op), comm_, stream(lane)), "ncclReduceScatter");
  }
  void all_gather(const char* src, char* dst, size_t seg, DType t, const Lane& lane) override {
    check(ncclAllGather(src, dst, seg, nccl_type(t), comm_, stream(lane)), "ncclAllGather");
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
    check(ncclGroupStart(), "ncclGroupStart");
    if (send_n) check(ncclSend(send, send_n, nccl_type(t), (me + 1) % n, comm_, s), "ncclSend");
    if (recv_n) check(ncclRecv(into, recv_n, nccl_type(t), (me + n - 1) % n, comm_, s), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
    if (into != recv) reduce_cuda(recv, into, recv_n, t, op, s);
  }
  void abort() { ncclCommAbort(comm_), owned_ = false; }

 private:
  static cudaStream_t stream(const Lane& lane) { return static_cast<cudaStream_t>(lane.stream); }
  ncclComm_t comm_;
  CudaDevice& dev_;
  bool owned_;
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

NcclTransport::NcclTransport(const std::string& id, int rank, int size, int device)
    : rank_(rank), size_(size), device_(device) {
  ncclUniqueId uid;
  if (id.size() != sizeof(uid.internal))
    throw Error("hocc nccl: a unique id has " + std::to_string(sizeof(uid.internal)) + " bytes, got " +
                std::to_string(id.size()));
  std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
  if (cudaSetDevice(device) != cudaSuccess) throw Error("hocc nccl: cannot use CUDA device " + std::to_string(device));
  ncclComm_t comm;
  check(ncclCommInitRank(&comm, size, uid, rank), "ncclCommInitRank");
  parent_ = comm;
  world_ = std::make_unique<NcclComm>(comm, rank, size, device_, false);
}

NcclTransport::~NcclTransport() {
  comms_.clear();
  world_.reset();
  if (parent_) ncclCommDestroy(static_cast<ncclComm_t>(parent_));
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
      ncclComm_t sub = nullptr;
      check(ncclCommSplit(static_cast<ncclComm_t>(parent_), color, me, &sub, nullptr), "ncclCommSplit");
      splits_.insert(key);
      if (!mine) continue;
      auto ckey = std::make_pair(stage, *mine);
      if (comms_.count(ckey)) {  // every member met this group first in the same earlier split: keep that one
        ncclCommDestroy(sub);
        continue;
      }
      comms_.emplace(ckey, std::make_unique<NcclComm>(sub, me, int(mine->size()), device_, true));
    }
}

Comm& NcclTransport::comm(int stage, const std::vector<int>& ranks, Impl) {
  if (is_whole(ranks, size_)) return *world_;  // the whole group in rank order: the parent communicator
  auto it = comms_.find({stage, ranks});
  if (it == comms_.end()) throw Error("hocc nccl: no communicator for a group of stage " + std::to_string(stage) +
                                      "; prepare() the plan first");
  return *it->second;
}

void NcclTransport::abort(const std::string&) {
  for (auto& [key, c] : comms_) static_cast<NcclComm*>(c.get())->abort();
}

}  // namespace hocc
