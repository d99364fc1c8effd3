// A plan as the C++ executor sees it: the same data as hocc/plan/types.py
// (steps of groups over slices of the work buffer), built from Python. The
// executor decides nothing; see types.py for the exact step semantics.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace hocc {

enum class Op : int { reduce_scatter, all_gather, all_reduce };
enum class Impl : int { native, ring, shm };

struct GroupSlice {
  std::vector<int> ranks;  // members in segment order (ranks of the plan's group)
  size_t offset = 0;       // elements into every member's work buffer
  size_t seg = 0;          // elements per segment
};

struct Step {
  int stage = 0;
  int chunk = 0;
  Op op = Op::all_reduce;
  Impl impl = Impl::native;
  std::vector<GroupSlice> groups;

  // the group `rank` belongs to in this step, or nullptr
  const GroupSlice* group_of(int rank) const {
    for (const auto& g : groups)
      for (int r : g.ranks)
        if (r == rank) return &g;
    return nullptr;
  }
};

struct Plan {
  int world = 1;
  int stages = 1;
  int chunks = 1;
  size_t work_elems = 0;  // size of the work buffer every rank passes
  std::vector<Step> steps;
};

Op parse_plan_op(const std::string& name);
Impl parse_impl(const std::string& name);

}  // namespace hocc
