// The executor's view of the network: a Transport gives one communicator (Comm)
// per group of a plan step; a Comm runs collectives in place on a region of
// the work buffer, with the segment semantics of hocc/plan/types.py.
//
// Implementations: in-process (ranks are threads of one process: tests, and
// one GPU), shared memory (CPU ranks of a host), UCX between CPU hosts
// (transport/ucx.h), and torch.distributed's own backends called from C++
// (transport/c10d.h: gloo between CPU hosts where UCX is not used, NCCL on GPUs).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/call.h"
#include "core/plan.h"
#include "core/record.h"
#include "core/types.h"
#include "device/device.h"

namespace hocc {

// Where a comm op runs: a CUDA stream (or null: the calling thread, on CPU),
// and the device that copies and reduces there.
struct Lane {
  void* stream = nullptr;
  Device* dev = nullptr;
  // where ring steps note their exchanges (null: not recorded), and the step
  RunRecord* rec = nullptr;
  int32_t step_rec = -1;
};

class Comm {
 public:
  Comm(int me, int n) : me(me), n(n) {}
  virtual ~Comm() = default;
  const int me;  // this rank's index among the members
  const int n;   // members
  // the members' ranks in the engine's group (set when a transport takes the
  // comm; for messages), and the call its ops belong to (null: none checked)
  std::vector<int> ranks;
  const CallId* call = nullptr;
  // when the latest exchange()'s receive ended (0: the transport does not
  // say; then the exchange's end counts), for the recorder (transport/ring.cc)
  int64_t recv_done_ns = 0;
  // this comm's scratch (its ops run on one lane at a time, so one will do)
  Scratch scratch;
  // bytes this comm holds between calls: its scratch, and any buffers of the transport's own
  virtual size_t held_bytes() const { return scratch.size(); }
  std::string who(int member) const {  // "rank 5" (or "member 2" before ranks are known)
    return member >= 0 && member < int(ranks.size()) ? "rank " + std::to_string(ranks[member])
                                                     : "member " + std::to_string(member);
  }

  // Native collectives on a region (segment i at dst + i*seg), reading from
  // `src`, which may be `dst` (in place) or a read-only buffer laid out alike.
  // The defaults run the rings of transport/ring.h over exchange().
  //   all_reduce      dst[0, count) = the reduction of every member's src
  //   reduce_scatter  src holds n segments; segment `me` of dst ends reduced,
  //                   dst's other segments are left undefined
  //   all_gather      src is this member's segment (it may be dst + me*seg);
  //                   dst ends with every member's
  //   reduce_scatter_out  torch.distributed's form: `out` (seg elements) gets
  //                   segment `me`, and nothing else is written
  //   broadcast       in place: dst[0, count) ends as member 0's on every member
  virtual void all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane);
  virtual void reduce_scatter(const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane);
  virtual void all_gather(const char* src, char* dst, size_t seg, DType t, const Lane& lane);
  virtual void reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane);
  virtual void broadcast(char* dst, size_t count, DType t, const Lane& lane);

  // One ring step: send `send_n` elements to member me+1 while receiving
  // `recv_n` from member me-1, reduced into `recv` with op (none: copied).
  virtual void exchange(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                        const Lane& lane) = 0;
  // A step with any two members: send to member `to` while receiving from member `from`. A transport with
  // endpoints to every member overrides it (UCX: Bruck's all-gather, transport/ring.h); the default is
  // exchange(), so it takes the ring's pair only and refuses any other.
  virtual void exchange_with(int to, const char* send, size_t send_n, int from, char* recv, size_t recv_n, DType t,
                             RedOp op, const Lane& lane);
  // a failure elsewhere (this rank, or a peer's, reported by the engine's
  // watchdog): wake this rank's waits on the comm and make peers blocked on it
  // fail too where the transport can; later ops fail at once. Thread-safe.
  virtual void abort(const std::string& /*why*/) {}
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device& device() = 0;
  // true: comm ops only enqueue on the lane's stream (NCCL); false: they
  // block the calling thread until done (in-process, shared memory)
  virtual bool async() const = 0;
  // create every communicator `plan` needs (collective: all ranks call it
  // with the same plans in the same order); idempotent
  virtual void prepare(const Plan& plan) = 0;
  // the communicator of one group of a plan step (impl: how the step runs,
  // for transports that keep a different communicator per impl)
  virtual Comm& comm(int stage, const std::vector<int>& ranks, Impl impl) = 0;
  // a run is about to start: the call every member must agree on
  virtual void begin(const CallId& /*call*/) {}
  // a failure: wake this rank's waits and peers blocked on this rank (Comm::abort)
  virtual void abort(const std::string& /*why*/) {}
};

}  // namespace hocc
