#include "core/plan.h"

#include <algorithm>

#include "core/json.h"
#include "core/types.h"

namespace hocc {

const RankSteps& Plan::for_rank(int rank) const {
  std::lock_guard<std::mutex> lk(body_->mu);
  auto found = body_->by_rank.find(rank);
  if (found != body_->by_rank.end()) return found->second;
  RankSteps lanes(static_cast<size_t>(stages));
  for (const Step& s : body_->steps) {
    if (s.stage < 0 || s.stage >= stages || s.chunk < 0 || s.chunk >= chunks())
      throw Error("hocc: plan step (stage " + std::to_string(s.stage) + ", chunk " + std::to_string(s.chunk) +
                  ") is outside the plan's " + std::to_string(stages) + " stages x " + std::to_string(chunks()) +
                  " chunks");
    MyStep it{&s, {}};
    for (const GroupSlice& g : s.groups)
      if (std::count(g.ranks.begin(), g.ranks.end(), rank)) it.groups.push_back(&g);
    if (!it.groups.empty()) lanes[size_t(s.stage)].push_back(std::move(it));
  }
  for (const auto& lane : lanes)
    for (size_t i = 1; i < lane.size(); ++i)
      if (lane[i].step->chunk < lane[i - 1].step->chunk)
        throw Error("hocc: plan steps of one stage are out of chunk order");
  return body_->by_rank.emplace(rank, std::move(lanes)).first->second;
}

void Plan::add_step(Step s) {
  std::lock_guard<std::mutex> lk(body_->mu);
  if (!body_->by_rank.empty() || body_.use_count() > 1)
    throw Error("hocc: a plan takes steps only while it is built (its copies and compiled parts share them)");
  body_->steps.push_back(std::move(s));
}

Plan Plan::scaled(size_t factor, size_t block_elems, WorkAt where, bool pack_input) const {
  if (!factor) throw Error("hocc: a plan scales by a factor of at least 1");
  Plan p = *this;
  p.scale = scale * factor;
  p.layout.piece = layout.piece * factor;
  p.layout.block_elems = block_elems;
  p.work_at = where;
  p.pack = pack_input;
  return p;
}

Op parse_plan_op(const std::string& n) {
  if (n == "reduce_scatter") return Op::reduce_scatter;
  if (n == "all_gather") return Op::all_gather;
  if (n == "all_reduce") return Op::all_reduce;
  if (n == "broadcast") return Op::broadcast;
  throw Error("hocc: unknown plan collective '" + n + "'");
}

Impl parse_impl(const std::string& n) {
  if (n == "native") return Impl::native;
  if (n == "ring") return Impl::ring;
  if (n == "shm") return Impl::shm;
  throw Error("hocc: unknown plan impl '" + n + "'");
}

const char* op_name(Op op) {
  switch (op) {
    case Op::reduce_scatter: return "reduce_scatter";
    case Op::all_gather: return "all_gather";
    case Op::all_reduce: return "all_reduce";
    case Op::broadcast: return "broadcast";
  }
  return "?";
}

const char* impl_name(Impl i) {
  switch (i) {
    case Impl::native: return "native";
    case Impl::ring: return "ring";
    case Impl::shm: return "shm";
  }
  return "?";
}

Buf parse_buf(const std::string& n) {
  if (n == "work") return Buf::work;
  if (n == "input") return Buf::input;
  if (n == "output") return Buf::output;
  throw Error("hocc: unknown plan buffer '" + n + "'");
}

WorkAt parse_work_at(const std::string& n) {
  if (n == "scratch") return WorkAt::scratch;
  if (n == "output") return WorkAt::output;
  if (n == "none") return WorkAt::none;
  throw Error("hocc: unknown work buffer place '" + n + "'");
}

Plan plan_from_json(const std::string& text) { return plan_from_json(parse_json(text)); }

namespace {
constexpr long long kMostInt = 0x7fffffff;
constexpr long long kMostElems = 1LL << 50;  // elements: far beyond any buffer, far below a size_t's wrap
}  // namespace

Plan plan_from_json(const Json& d) {
  Plan p;
  p.collective = parse_plan_op(d.at("collective").text());
  if (p.collective == Op::broadcast) throw Error("hocc: broadcast is a step's op, not a plan's collective");
  p.world = int(d.at("world").natural(kMostInt));
  p.stages = int(d.at("stages").natural(kMostInt));
  const Json& lay = d.at("layout");
  std::vector<int> order;
  for (const Json& o : lay.at("order").array()) {  // a caller block's index, or kPadBlock
    const long long b = o.integer();
    if (b != kPadBlock && (b < 0 || b > kMostInt))
      throw Error("hocc: the layout's block order names block " + std::to_string(b));
    order.push_back(int(b));
  }
  p.layout = Layout{int(lay.at("blocks").natural(kMostInt)), size_t(lay.at("block_elems").natural(kMostElems)),
                    int(lay.at("chunks").natural(kMostInt)), size_t(lay.at("piece").natural(kMostElems)), order};
  const Json* work_at = d.find("work_at");
  p.work_at = parse_work_at(work_at ? work_at->text() : "scratch");
  const Json* pack = d.find("pack");
  p.pack = pack ? pack->boolean() : true;
  if (p.stages < 1 || p.layout.chunks < 1 || p.world < 1)
    throw Error("hocc: a plan needs at least one stage, chunk and rank");
  if (p.collective != Op::all_reduce && int(order.size()) != p.layout.blocks)
    throw Error("hocc: the layout's block order has " + std::to_string(order.size()) + " entries for " +
                std::to_string(p.layout.blocks) + " blocks");
  for (const Json& js : d.at("steps").array()) {
    Step s;
    s.stage = int(js.at("stage").natural(kMostInt)), s.chunk = int(js.at("chunk").natural(kMostInt));
    s.op = parse_plan_op(js.at("collective").text()), s.impl = parse_impl(js.at("impl").text());
    const Json* src = js.find("src");
    const Json* dst = js.find("dst");
    s.src = parse_buf(src ? src->text() : "work"), s.dst = parse_buf(dst ? dst->text() : "work");
    const Json* tier = js.find("tier");
    if (tier) s.tier = tier->text();
    for (const Json& jg : js.at("groups").array()) {
      GroupSlice g;
      for (const Json& r : jg.at("ranks").array()) {
        const long long rank = r.natural(kMostInt);
        if (rank < 0 || rank >= p.world)
          throw Error("hocc: plan group names rank " + std::to_string(rank) + " of " + std::to_string(p.world));
        g.ranks.push_back(int(rank));
      }
      g.offset = size_t(jg.at("offset").natural(kMostElems)), g.seg = size_t(jg.at("seg").natural(kMostElems));
      s.groups.push_back(std::move(g));
    }
    p.add_step(std::move(s));
  }
  return p;
}

}  // namespace hocc
