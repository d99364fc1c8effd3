// The executor's view of the network: a Transport gives one communicator (Comm)
// per group of a plan step; a Comm runs collectives in place on a region of
// the work buffer, with the segment semantics of hocc/plan/types.py.
//
// Implementations: in-process (ranks are threads of one process: tests, and
// one GPU), NCCL (GPUs, stream-ordered), shared memory (CPU ranks of a host).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/plan.h"
#include "core/types.h"
#include "device/device.h"

namespace hocc {

// Where a comm op runs: a CUDA stream (or null: the calling thread, on CPU).
struct Lane {
  void* stream = nullptr;
};

class Comm {
 public:
  Comm(int me, int n) : me(me), n(n) {}
  virtual ~Comm() = default;
  const int me;  // this rank's index among the members
  const int n;   // members

  // Native collectives, in place on `base` (segment i at base + i*seg).
  // The default runs the rings of transport/ring.h over exchange().
  virtual void reduce_scatter(char* base, size_t seg, DType t, RedOp op, const Lane& lane);
  virtual void all_gather(char* base, size_t seg, DType t, const Lane& lane);
  virtual void all_reduce(char* base, size_t count, DType t, RedOp op, const Lane& lane);

  // One ring step: send `send_n` elements to member me+1 while receiving
  // `recv_n` from member me-1, reduced into `recv` with op (none: copied).
  virtual void exchange(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                        const Lane& lane) = 0;
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
  virtual Comm& comm(int stage, const std::vector<int>& ranks) = 0;
  // a local failure: wake peers blocked on this rank so they fail too
  virtual void abort(const std::string& /*why*/) {}
};

}  // namespace hocc
