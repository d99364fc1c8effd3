// A Comm over UCX (ucp tag messages): ring steps between hosts without
// gloo's threads. gloo's sub-groups cost ~270 us per exchange on these
// machines (a hand-off to gloo's threads and back); a ucp tag message over
// tcp costs a few microseconds, and this comm progresses its worker on the
// calling thread, so nothing is handed off.
//
// One ucp worker per comm, over one ucp context per process. A comm's ops run
// on one lane at a time (transport.h), so its worker is used by one thread at
// a time and needs no lock of hocc's; each stage progresses only its own
// messages, as each stage has its own gloo sub-group for the same reason.
// Endpoints are made from worker addresses that the members trade through the
// group's store (hocc/engine/ucx.py), so torchrun starts it as it starts gloo.
// connect() makes 2 log2(n) of them: the ring neighbours' and the partners of
// Bruck's all-gather (1, 2, 4, ... members away either way).
//
// exchange() and exchange_with() are its only ops of its own: the native
// collectives are the rings of transport/ring.h over them, and small gathers
// (an all_gather, or a tiny all_reduce's inputs) Bruck's all-gather. Built
// without UCX's headers (setup.py), the class is still here, and making one
// raises (ucx_unavailable() says why).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace hocc {

// "" when UCX can be used here (built with it, and a ucp context starts),
// else why not. Starts the process's context on first call.
std::string ucx_unavailable();
// UCX's version ("1.22.0"), or "" when built without it
std::string ucx_version();

class UcxComm final : public Comm {
 public:
  // this rank is member `me` of `n`; every wait ends after `timeout_s`, and polls `spin_us` before it sleeps
  UcxComm(int me, int n, double timeout_s, double spin_us);
  ~UcxComm() override;
  UcxComm(const UcxComm&) = delete;
  UcxComm& operator=(const UcxComm&) = delete;

  // this comm's worker address, for the store
  std::string address() const;
  // every member's worker address, in member order (this member's own is not used): endpoints to the ring
  // neighbours and to Bruck's partners
  void connect(std::vector<std::string> addresses);

  void exchange(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                const Lane& lane) override;
  void exchange_with(int to, const char* send, size_t send_n, int from, char* recv, size_t recv_n, DType t,
                     RedOp op, const Lane& lane) override;
  // a tiny all_reduce (n x its bytes <= kTinyGather) gathers every member's input (Bruck's all-gather) and
  // reduces in member order (alike on every member): ceil(log2 n) steps instead of the ring's 2(n-1)
  void all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane) override;
  // a gathered size up to kTinyGather: Bruck's ceil(log2 n) steps; above it the ring's n-1 (the same bytes)
  void all_gather(const char* src, char* dst, size_t seg, DType t, const Lane& lane) override;
  static constexpr size_t kTinyGather = 16 << 10;
  // the ring reading src in place (ring_reduce_scatter_out): 2 segments of scratch, not n
  void reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane) override;
  // wakes a wait on this comm (its own thread then closes the endpoints, which
  // fails the neighbours' waits too); later ops fail at once. Thread-safe.
  void abort(const std::string& why) override;

  // scratch, and the buffers a reduction lands in and a tiny all_reduce gathers into
  size_t held_bytes() const override;
  bool broken() const;
  // ucp_worker_progress calls, and how many waits slept on the event fd (for tuning the spin)
  uint64_t progress_calls() const;
  uint64_t sleeps() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hocc
