#include "executor/layout.h"

#include <algorithm>
#include <string>

#include "core/types.h"

namespace hocc {
namespace {

int position(const Layout& l, int rank) {
  auto it = std::find(l.order.begin(), l.order.end(), rank);
  if (it == l.order.end()) throw Error("hocc: rank " + std::to_string(rank) + " has no block in the plan's layout");
  return int(it - l.order.begin());
}

// elements of chunk k's piece that hold data (the rest is padding)
size_t filled(const Layout& l, int k) {
  const size_t start = size_t(k) * l.piece;
  return start >= l.block_elems ? 0 : std::min(l.piece, l.block_elems - start);
}

void copy(Device& dev, char* dst, const char* src, size_t bytes, void* stream) {
  if (bytes) dev.reduce(dst, src, bytes, DType::u8, RedOp::none, stream);
}

}  // namespace

void pack(const Plan& p, int rank, const char* input, char* work, size_t es, Device& dev, void* stream) {
  const Layout& l = p.layout;
  if (p.collective == Op::all_reduce) {
    copy(dev, work, input, l.block_elems * es, stream);
    dev.zero(work + l.block_elems * es, (l.size() - l.block_elems) * es, stream);
    return;
  }
  // reduce_scatter: every block into its position; all_gather: my block into mine
  const int me = p.collective == Op::all_gather ? position(l, rank) : -1;
  for (int k = 0; k < l.chunks; ++k) {
    const size_t len = filled(l, k);
    for (int i = 0; i < l.blocks; ++i) {
      if (me >= 0 && i != me) continue;
      const size_t block = me >= 0 ? 0 : size_t(l.order[i]);
      char* to = work + (size_t(k) * l.blocks + i) * l.piece * es;
      copy(dev, to, input + (block * l.block_elems + size_t(k) * l.piece) * es, len * es, stream);
      dev.zero(to + len * es, (l.piece - len) * es, stream);
    }
  }
}

void unpack(const Plan& p, int rank, const char* work, char* output, size_t es, Device& dev, void* stream) {
  const Layout& l = p.layout;
  if (p.collective == Op::all_reduce) {
    copy(dev, output, work, l.block_elems * es, stream);
    return;
  }
  // reduce_scatter: my block out of every chunk; all_gather: every block
  const int me = p.collective == Op::reduce_scatter ? position(l, rank) : -1;
  for (int k = 0; k < l.chunks; ++k) {
    const size_t len = filled(l, k);
    for (int i = 0; i < l.blocks; ++i) {
      if (me >= 0 && i != me) continue;
      const size_t block = me >= 0 ? 0 : size_t(l.order[i]);
      copy(dev, output + (block * l.block_elems + size_t(k) * l.piece) * es,
           work + (size_t(k) * l.blocks + i) * l.piece * es, len * es, stream);
    }
  }
}

}  // namespace hocc
