// A plan as the C++ executor sees it: the same data as hocc/plan/types.py
// (a layout, and steps of groups over slices of named buffers), built from
// Python. The executor decides nothing; see types.py for the exact semantics.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hocc {

// the collectives, in the one order everything uses: kCollectives (core/call.cc, exported as
// hocc._C.COLLECTIVES) and hocc.plan.types.COLLECTIVES, which the suite checks against it. broadcast is a
// step's op only (a host's leader hands the result to its host: hocc/plan/leaders.py), never a plan's
enum class Op : int { all_reduce, all_gather, reduce_scatter, broadcast };
enum class Impl : int { native, ring, shm };
// Where a step reads and writes: the work buffer, or the caller's tensors.
enum class Buf : int { work, input, output };
// Where the work buffer lives: private scratch, the caller's output (the
// layout is the identity there, so nothing is unpacked), or nowhere.
enum class WorkAt : int { scratch, output, none };

struct GroupSlice {
  std::vector<int> ranks;  // members in segment order (ranks of the plan's group)
  size_t offset = 0;       // elements into the buffer
  size_t seg = 0;          // elements per segment
};

struct Step {
  int stage = 0;
  int chunk = 0;
  Op op = Op::all_reduce;
  Impl impl = Impl::native;
  Buf src = Buf::work, dst = Buf::work;
  std::vector<GroupSlice> groups;
  std::string tier;  // the link tier the stage crosses (for a failure's text)
  // units of the work buffer group g's members touch in this step, from g.offset (hocc.plan.types'
  // Step.region): one segment for all_reduce and broadcast, one per member otherwise
  size_t region_units(const GroupSlice& g) const {
    return op == Op::all_reduce || op == Op::broadcast ? g.seg : g.ranks.size() * g.seg;
  }
};

// How the caller's buffers map onto the work buffer [chunks][blocks][piece]:
// work[k][i] holds elements [k*piece, (k+1)*piece) of caller block order[i],
// zero beyond block_elems. An order entry kPadBlock is a slot of no caller
// block (HO-Ring on unequal hosts pads short hosts' rails): zeros on pack,
// skipped on unpack.
constexpr int kPadBlock = -1;
struct Layout {
  int blocks = 1;
  size_t block_elems = 0;
  int chunks = 1;
  size_t piece = 0;
  std::vector<int> order;
  size_t size() const { return size_t(chunks) * size_t(blocks) * piece; }
};

// One rank's part of a plan, compiled once: per stage, the steps the rank
// takes part in, in chunk order, each with the groups it is in.
struct MyStep {
  const Step* step;
  std::vector<const GroupSlice*> groups;
};
using RankSteps = std::vector<std::vector<MyStep>>;

// A plan's steps and each rank's compiled part of them, shared by every copy
// and every scaled form of the plan (the parts point into these steps).
struct PlanBody {
  std::vector<Step> steps;
  std::mutex mu;
  std::map<int, RankSteps> by_rank;
};

struct Plan {
  Op collective = Op::all_reduce;
  int world = 1;
  int stages = 1;
  Layout layout;
  WorkAt work_at = WorkAt::scratch;
  bool pack = true;  // copy the caller's input into the work buffer first
  // the steps' offsets and segments count units of `scale` elements: one set
  // of steps serves every size of a collective (hocc/plan/shapes.py)
  size_t scale = 1;
  int chunks() const { return layout.chunks; }
  const std::vector<Step>& steps() const { return body_->steps; }
  void add_step(Step s);  // while the plan is built: its copies and compiled parts share the steps
  // rank's part (checked: every step inside the plan, each stage in chunk
  // order), computed at its first run and kept: a plan is cached and run many
  // times, by one rank (an engine) or by every rank's thread (in-process)
  const RankSteps& for_rank(int rank) const;
  // this plan for a caller's `block_elems` elements per block, its offsets,
  // segments and piece times `factor`, with its own buffer routing: the steps
  // and their compiled parts are shared, not copied, so any size costs the
  // same few hundred nanoseconds
  Plan scaled(size_t factor, size_t block_elems, WorkAt work_at, bool pack) const;

 private:
  std::shared_ptr<PlanBody> body_ = std::make_shared<PlanBody>();
};

Op parse_plan_op(const std::string& name);
Impl parse_impl(const std::string& name);
const char* op_name(Op op);      // the names parse_plan_op and parse_impl read
const char* impl_name(Impl impl);
Buf parse_buf(const std::string& name);
WorkAt parse_work_at(const std::string& name);

// A plan from hocc.plan.types.Plan.to_json's text: the one form a plan crosses into C++ in (the
// bindings, and the sanitizer's fixtures the planner wrote). Checked as it is read.
Plan plan_from_json(const std::string& text);
struct Json;
Plan plan_from_json(const Json& plan);  // one plan of a parsed document (the fixtures hold lists of them)

}  // namespace hocc
