#include "transport/ring.h"

#include <vector>

namespace hocc {
namespace {

// segment i of a ring: equal segments, or n near-equal parts of a region
std::vector<Part> equal_parts(size_t seg, int n) {
  std::vector<Part> p(n);
  for (int i = 0; i < n; ++i) p[i] = {size_t(i) * seg, seg};
  return p;
}

std::vector<Part> split_even(size_t count, int n) {
  std::vector<Part> p(n);
  for (int i = 0; i < n; ++i) p[i] = even_part(count, n, i);
  return p;
}

inline int mod(int a, int n) { return ((a % n) + n) % n; }

void reduce_scatter_parts(Comm& c, char* base, const std::vector<Part>& p, DType t, RedOp op, const Lane& lane) {
  const size_t es = dtype_size(t);
  for (int s = 0; s < c.n - 1; ++s) {
    const Part& out = p[mod(c.me - s - 1, c.n)];
    const Part& in = p[mod(c.me - s - 2, c.n)];
    c.exchange(base + out.start * es, out.len, base + in.start * es, in.len, t, op, lane);
  }
}

void all_gather_parts(Comm& c, char* base, const std::vector<Part>& p, DType t, const Lane& lane) {
  const size_t es = dtype_size(t);
  for (int s = 0; s < c.n - 1; ++s) {
    const Part& out = p[mod(c.me - s, c.n)];
    const Part& in = p[mod(c.me - s - 1, c.n)];
    c.exchange(base + out.start * es, out.len, base + in.start * es, in.len, t, RedOp::none, lane);
  }
}

}  // namespace

void ring_reduce_scatter(Comm& c, char* base, size_t seg, DType t, RedOp op, const Lane& lane) {
  if (c.n > 1) reduce_scatter_parts(c, base, equal_parts(seg, c.n), t, op, lane);
}

void ring_all_gather(Comm& c, char* base, size_t seg, DType t, const Lane& lane) {
  if (c.n > 1) all_gather_parts(c, base, equal_parts(seg, c.n), t, lane);
}

void ring_all_reduce(Comm& c, char* base, size_t count, DType t, RedOp op, const Lane& lane) {
  if (c.n < 2) return;
  auto parts = split_even(count, c.n);
  reduce_scatter_parts(c, base, parts, t, op, lane);
  all_gather_parts(c, base, parts, t, lane);
}

void Comm::reduce_scatter(char* base, size_t seg, DType t, RedOp op, const Lane& lane) {
  ring_reduce_scatter(*this, base, seg, t, op, lane);
}

void Comm::all_gather(char* base, size_t seg, DType t, const Lane& lane) {
  ring_all_gather(*this, base, seg, t, lane);
}

void Comm::all_reduce(char* base, size_t count, DType t, RedOp op, const Lane& lane) {
  ring_all_reduce(*this, base, count, t, op, lane);
}

}  // namespace hocc
