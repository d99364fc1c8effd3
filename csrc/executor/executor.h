// Runs a plan on one rank's work buffer over a Transport. Decides nothing.
//
// Each pipeline stage is a lane. Step (s, k) starts after step (s-1, k) ends;
// a lane runs its steps in chunk order, so stages overlap across chunks.
//   async transports (NCCL): one host thread enqueues every step in wavefront
//     order (the same order on every rank, so communicators never wait on each
//     other in opposite orders) on its stage's stream, with CUDA events for the
//     (s-1, k) dependencies; the caller's stream waits for the end. Never blocks.
//   blocking transports (in-process, shared memory): one thread per stage,
//     handing chunks on through done flags; the first failure aborts the
//     transport so peers fail instead of waiting, and is rethrown.
#pragma once

#include <vector>

#include "core/plan.h"
#include "core/types.h"
#include "transport/transport.h"

namespace hocc {

class Executor {
 public:
  explicit Executor(Transport& t) : t_(t) {}
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // `work` holds plan.work_elems elements of `dtype` on the transport's device;
  // `caller_stream` (CUDA) orders the run after the caller's work and the
  // caller's later work after the run.
  void run(const Plan& plan, void* work, DType dtype, RedOp op, void* caller_stream = nullptr);

 private:
  struct Mine {
    const Step* step;
    const GroupSlice* group;
  };
  std::vector<std::vector<Mine>> my_steps(const Plan& plan) const;  // [stage] -> steps in chunk order
  void run_step(const Mine& m, char* work, DType t, RedOp op, const Lane& lane);
  void run_async(const Plan& plan, char* work, DType t, RedOp op, void* caller_stream);
  void run_threads(const Plan& plan, char* work, DType t, RedOp op, void* caller_stream);
  void* lane_stream(int stage);

  Transport& t_;
  std::vector<void*> streams_;  // one per stage, created on first use
};

}  // namespace hocc
