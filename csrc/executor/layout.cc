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

// every entry a rank of the plan or a pad slot, before any byte moves
void check_order(const Plan& p) {
  for (int b : p.layout.order)
    if (b != kPadBlock && (b < 0 || b >= p.world))
      throw Error("hocc: the plan's layout names block " + std::to_string(b) + ", outside 0.." +
                  std::to_string(p.world - 1) + " (or " + std::to_string(kPadBlock) + " for a pad slot)");
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
  check_order(p);
  // reduce_scatter: every block into its position (pad slots zeroed); all_gather: my block into mine
  const int me = p.collective == Op::all_gather ? position(l, rank) : -1;
  for (int k = 0; k < l.chunks; ++k) {
    const size_t len = filled(l, k);
    for (int i = 0; i < l.blocks; ++i) {
      if (me >= 0 && i != me) continue;
      char* to = work + (size_t(k) * l.blocks + i) * l.piece * es;
      if (l.order[i] == kPadBlock) {  // a slot no rank owns: zeros, so it adds nothing where it is reduced
        dev.zero(to, l.piece * es, stream);
        continue;
      }
      const size_t block = me >= 0 ? 0 : size_t(l.order[i]);
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
  check_order(p);
  // reduce_scatter: my block out of every chunk; all_gather: every block
  const int me = p.collective == Op::reduce_scatter ? position(l, rank) : -1;
  for (int k = 0; k < l.chunks; ++k) {
    const size_t len = filled(l, k);
    for (int i = 0; i < l.blocks; ++i) {
      if ((me >= 0 && i != me) || l.order[i] == kPadBlock) continue;  // pad slots are nobody's output
      const size_t block = me >= 0 ? 0 : size_t(l.order[i]);
      copy(dev, output + (block * l.block_elems + size_t(k) * l.piece) * es,
           work + (size_t(k) * l.blocks + i) * l.piece * es, len * es, stream);
    }
  }
}

}  // namespace hocc
