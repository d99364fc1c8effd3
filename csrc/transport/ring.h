// Rings over Comm::exchange, for members in any order (member i sends to i+1),
// and Bruck's all-gather over Comm::exchange_with (a comm with endpoints to
// every member), whose ceil(log2 n) steps beat the ring's n-1 for small calls.
//   reduce-scatter: at step t member i sends segment i-t-1 and reduces the
//     received segment i-t-2 into place; after n-1 steps it holds segment i.
//   all-gather: at step t it sends segment i-t and receives segment i-t-1.
//   all-reduce: reduce-scatter then all-gather over n near-equal parts.
//   broadcast: a chain from member 0; at step t member t sends the region to
//     t+1 (every member takes part in every step, the others with nothing).
// Each member sends (n-1) segments per phase: 2(n-1)/n of the data for
// all-reduce, (n-1)/n of the gathered size for the others. Rings work in
// place on dst; a separate src is copied in first (src/dst as in Comm).
#pragma once

#include "transport/transport.h"

namespace hocc {

// Part i of `count` elements cut into n contiguous parts whose lengths differ
// by at most one (the first count % n are one longer).
struct Part {
  size_t start, len;
};
inline Part even_part(size_t count, int n, int i) {
  const size_t q = count / n, r = count % n, u = size_t(i);
  return {u * q + (u < r ? u : r), q + (u < r ? 1 : 0)};
}

void ring_reduce_scatter(Comm& c, const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane);
void ring_all_gather(Comm& c, const char* src, char* dst, size_t seg, DType t, const Lane& lane);
void ring_all_reduce(Comm& c, const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane);
void ring_broadcast(Comm& c, char* dst, size_t count, DType t, const Lane& lane);
// every member's `seg` elements into dst in member order, in ceil(log2 n) steps: at step k (d = 2^k) a
// member sends the min(d, n-d) blocks it holds to member me+d and takes as many from me-d (the first step
// is the ring's, so the call check pairs members as a ring does). Bytes sent are the ring's; steps are
// fewer. Needs c.exchange_with past the first step; uses c.scratch (n x seg) for the blocks in arrival order.
void bruck_all_gather(Comm& c, const char* src, char* dst, size_t seg, DType t, const Lane& lane);
// reduce_scatter_out's ring (Comm's semantics) reading src in place: each step's partial goes to one of
// two segments of c.scratch (2 x seg, not the n x seg region a copy of src would take), the last into out
void ring_reduce_scatter_out(Comm& c, const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane);

// dst = src over n elements on the lane's device, unless they are the same memory
void copy_in(const char* src, char* dst, size_t n, DType t, const Lane& lane);

}  // namespace hocc
