#include "transport/ring.h"

#include <algorithm>
#include <string>
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

// one step with members `to` and `from`, noted in the lane's record (core/record.h) when there is one
template <typename Run>
void recorded(Comm& c, int to, size_t send_n, int from, size_t recv_n, DType t, const Lane& lane, Run run) {
  if (!lane.rec) return run();
  const int64_t post = wall_ns();
  c.recv_done_ns = 0;
  run();
  const int64_t end = wall_ns(), es = int64_t(dtype_size(t));
  auto rank = [&](int m) { return m >= 0 && m < int(c.ranks.size()) ? c.ranks[size_t(m)] : -1; };
  lane.rec->exchange({lane.step_rec, rank(to), rank(from), post, c.recv_done_ns ? c.recv_done_ns : end, end,
                      int64_t(send_n) * es, int64_t(recv_n) * es});
}

// one ring step
void exchange(Comm& c, const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
              const Lane& lane) {
  recorded(c, mod(c.me + 1, c.n), send_n, mod(c.me - 1, c.n), recv_n, t, lane,
           [&] { c.exchange(send, send_n, recv, recv_n, t, op, lane); });
}

void reduce_scatter_parts(Comm& c, char* base, const std::vector<Part>& p, DType t, RedOp op, const Lane& lane) {
  const size_t es = dtype_size(t);
  for (int s = 0; s < c.n - 1; ++s) {
    const Part& out = p[mod(c.me - s - 1, c.n)];
    const Part& in = p[mod(c.me - s - 2, c.n)];
    exchange(c, base + out.start * es, out.len, base + in.start * es, in.len, t, op, lane);
  }
}

void all_gather_parts(Comm& c, char* base, const std::vector<Part>& p, DType t, const Lane& lane) {
  const size_t es = dtype_size(t);
  for (int s = 0; s < c.n - 1; ++s) {
    const Part& out = p[mod(c.me - s, c.n)];
    const Part& in = p[mod(c.me - s - 1, c.n)];
    exchange(c, base + out.start * es, out.len, base + in.start * es, in.len, t, RedOp::none, lane);
  }
}

}  // namespace

void copy_in(const char* src, char* dst, size_t n, DType t, const Lane& lane) {
  if (src == dst || n == 0) return;
  if (!lane.dev) throw Error("hocc: a lane without a device cannot copy");
  lane.dev->reduce(dst, src, n, t, RedOp::none, lane.stream);
}

void ring_reduce_scatter(Comm& c, const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane) {
  copy_in(src, dst, seg * c.n, t, lane);
  if (c.n > 1) reduce_scatter_parts(c, dst, equal_parts(seg, c.n), t, op, lane);
}

void ring_all_gather(Comm& c, const char* src, char* dst, size_t seg, DType t, const Lane& lane) {
  copy_in(src, dst + size_t(c.me) * seg * dtype_size(t), seg, t, lane);
  if (c.n > 1) all_gather_parts(c, dst, equal_parts(seg, c.n), t, lane);
}

void ring_all_reduce(Comm& c, const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane) {
  copy_in(src, dst, count, t, lane);
  if (c.n < 2) return;
  auto parts = split_even(count, c.n);
  reduce_scatter_parts(c, dst, parts, t, op, lane);
  all_gather_parts(c, dst, parts, t, lane);
}

void ring_broadcast(Comm& c, char* dst, size_t count, DType t, const Lane& lane) {
  for (int s = 0; s < c.n - 1; ++s)  // exchanges of nothing keep every member's steps paired with its peers'
    exchange(c, dst, s == c.me ? count : 0, dst, s == c.me - 1 ? count : 0, t, RedOp::none, lane);
}

void bruck_all_gather(Comm& c, const char* src, char* dst, size_t seg, DType t, const Lane& lane) {
  const size_t es = dtype_size(t), bytes = seg * es;
  if (c.n == 1) return copy_in(src, dst, seg, t, lane);
  if (!lane.dev) throw Error("hocc: a lane without a device cannot allocate");
  // held[i] is member me-i's block: ours first, then what each step brings, in that order
  char* held = c.scratch.at_least(size_t(c.n) * bytes, *lane.dev);
  copy_in(src, held, seg, t, lane);
  for (int d = 1; d < c.n; d *= 2) {
    const int to = mod(c.me + d, c.n), from = mod(c.me - d, c.n);
    const size_t k = size_t(std::min(d, c.n - d)) * seg;
    recorded(c, to, k, from, k, t, lane,
             [&] { c.exchange_with(to, held, k, from, held + size_t(d) * bytes, k, t, RedOp::none, lane); });
  }
  for (int i = 0; i < c.n; ++i) copy_in(held + size_t(i) * bytes, dst + size_t(mod(c.me - i, c.n)) * bytes, seg, t, lane);
}

void Comm::exchange_with(int to, const char* send, size_t send_n, int from, char* recv, size_t recv_n, DType t,
                         RedOp op, const Lane& lane) {
  if (to != mod(me + 1, n) || from != mod(me - 1, n))
    throw Error("hocc: this transport exchanges with its ring neighbours only (asked: to member " +
                std::to_string(to) + ", from member " + std::to_string(from) + ")");
  exchange(send, send_n, recv, recv_n, t, op, lane);
}

void ring_reduce_scatter_out(Comm& c, const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane) {
  const size_t es = dtype_size(t), bytes = seg * es;
  auto part = [&](int j) { return src + size_t(mod(j, c.n)) * bytes; };
  if (c.n == 1) return copy_in(src, out, seg, t, lane);
  // step s receives segment me-s-2's partial onto our own piece of it, as ring_reduce_scatter does in place;
  // an out that overlaps src elsewhere than our own segment gets the last partial beside first
  const bool apart = out != part(c.me) && out < src + size_t(c.n) * bytes && src < out + bytes;
  const int held = (c.n > 2 ? 2 : 0) + (apart ? 1 : 0);
  char* buf = held ? c.scratch.at_least(size_t(held) * bytes, *lane.dev) : nullptr;
  char* last = apart ? buf + size_t(held - 1) * bytes : out;
  const char* send = part(c.me - 1);
  for (int s = 0; s < c.n - 1; ++s) {
    char* recv = s == c.n - 2 ? last : buf + size_t(s % 2) * bytes;
    copy_in(part(c.me - s - 2), recv, seg, t, lane);
    exchange(c, send, seg, recv, seg, t, op, lane);
    send = recv;
  }
  if (last != out) copy_in(last, out, seg, t, lane);
}

void Comm::reduce_scatter(const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane) {
  ring_reduce_scatter(*this, src, dst, seg, t, op, lane);
}

void Comm::all_gather(const char* src, char* dst, size_t seg, DType t, const Lane& lane) {
  ring_all_gather(*this, src, dst, seg, t, lane);
}

void Comm::all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane) {
  ring_all_reduce(*this, src, dst, count, t, op, lane);
}

void Comm::broadcast(char* dst, size_t count, DType t, const Lane& lane) { ring_broadcast(*this, dst, count, t, lane); }

void Comm::reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane) {
  // a private region, so the caller's input is only read
  const size_t es = dtype_size(t);
  if (!lane.dev) throw Error("hocc: a lane without a device cannot allocate");
  char* region = scratch.at_least(seg * size_t(n) * es, *lane.dev);
  reduce_scatter(src, region, seg, t, op, lane);
  copy_in(region + size_t(me) * seg * es, out, seg, t, lane);
}

}  // namespace hocc
