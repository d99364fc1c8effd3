// Shared-memory transport for the CPU ranks of one host group: the host
// stages of ho_ring (and single-host collectives) at memory speed instead of
// through loopback TCP.
//
// Segment (a /dev/shm file the Python side creates, publishes through the
// store and unlinks once every member has mapped it; hocc/engine/shm.py):
//   [header: arrival counter, generation word, abort flag]
//   [per member: pid, last barrier reached, call id][member][2 halves]
// Each op streams the caller's region through the slots piece by piece. Pieces
// alternate between the two halves of every slot (across ops too), so a piece
// needs one barrier after its writes and none before them: a member writes a
// half again only after a barrier that every member reached after reading it.
//   all_gather      copy my piece in; barrier; copy every other member's out
//   reduce_scatter  copy my n parts in (all but my own); barrier; reduce part
//                   `me` of every slot, and my own, into my segment
//   all_reduce      copy my piece in; barrier; reduce my 1/n of it across the
//                   slots into my slot; barrier; copy all n reduced parts out
//   broadcast       member 0 copies its piece in; barrier; the others copy it out
// Barriers count arrivals on one shared counter; the last arriver bumps the
// generation and wakes the others. How waiters wait is a choice (WaitMode):
// these machines run 8 ranks on 2 cores, where spinning starves the very
// peers being waited for. A member that fails or times out sets the abort
// flag, so peers fail at once instead of waiting out their timeout; a peer
// that died (its pid is gone) fails the group within 100 ms; a timeout names
// the members that did not arrive. The first barrier of each call also
// checks that every member is in the same call (core/call.h).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "transport/transport.h"

namespace hocc {

enum class WaitMode : int {
  futex,   // sleep in the kernel until woken (an op of one piece first yields for up to 1 ms)
  yield,   // spin with sched_yield(): gives the core to any runnable peer, but
           // keeps it busy when none is (e.g. all wait on the network)
  hybrid,  // sched_yield() for up to 1 ms, then futex
  sleep,   // poll with exponentially growing sleeps (20 us .. 1 ms)
};
WaitMode parse_wait_mode(const std::string& name);

class ShmComm final : public Comm {
 public:
  static size_t header_bytes(int n);
  static size_t segment_bytes(int n, size_t half_bytes);
  ShmComm(const std::string& path, int me, int n, size_t half_bytes, double timeout_s, WaitMode wait);
  ~ShmComm() override;
  ShmComm(const ShmComm&) = delete;
  ShmComm& operator=(const ShmComm&) = delete;

  // an all_reduce of at most this many bytes (and one piece) takes one barrier: every member reduces the
  // whole of it over every slot
  static constexpr size_t kWholeReduceBytes = 2048;
  void all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane) override;
  void reduce_scatter(const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane) override;
  void all_gather(const char* src, char* dst, size_t seg, DType t, const Lane& lane) override;
  void reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane) override;
  void broadcast(char* dst, size_t count, DType t, const Lane& lane) override;
  void exchange(const char*, size_t, char*, size_t, DType, RedOp, const Lane&) override;
  void abort(const std::string& why) override;  // sets the shared abort flag: every member fails

  bool broken() const { return !broken_.empty(); }
  uint64_t barriers() const { return seq_; }
  // seconds spent waiting in barriers (for measuring wait strategies)
  double wait_seconds() const { return waited_; }

 private:
  struct Header;
  struct Member;
  void barrier();
  void wait_for(uint32_t want);
  void agree();
  std::string missing(uint64_t want) const;
  void check_alive(uint64_t want);
  [[noreturn]] void fail(const std::string& why, bool mismatch = false);
  char* slot(int member, int half) const;
  void check_usable() const;

  Header* hdr_ = nullptr;
  Member* members_ = nullptr;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  size_t half_bytes_;
  double timeout_s_;
  WaitMode wait_;
  uint64_t seq_ = 0;   // barriers this member passed
  uint64_t piece_ = 0;  // pieces streamed so far: piece_ % 2 is the half in use
  double waited_ = 0;
  bool one_piece_ = false;  // the running op fits one piece: its barriers yield before they sleep (futex)
  std::string broken_;
  uint64_t agreed_ = ~uint64_t(0);  // the last call checked with every member
  uint64_t checked_ = 0;            // calls checked: which call slot is in use
  std::mutex mu_;
  std::string aborted_;  // why abort() was called here
};

}  // namespace hocc
