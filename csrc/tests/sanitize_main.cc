// A standalone test of hocc's C++ core, built twice by `make sanitize` (once
// with AddressSanitizer + UndefinedBehaviorSanitizer, once with
// ThreadSanitizer) from the csrc/ files that need neither torch nor pybind11.
// It builds Plans through the C++ API and runs them on ranks that are threads
// (and, for the shared-memory transport, processes), compares every result
// with a reference computed here, and drives the failure paths: a rank that
// fails, one that never comes, one that is slow, an injected fault, ranks that
// disagree on the call, a member process that dies, and timeouts. Any wrong
// result, any error where none is due, or any rank that hangs or fails to
// report a failure makes it exit non-zero; a global alarm ends it if
// something hangs for good.
//
// What runs:
//   in-process  flat rings (rank order and a shuffled order), uniform
//               HO-Ring grids (2x2, 3x2) and the unequal-host HO-Ring of
//               hosts of 3 and 2 ranks (several groups per rank per step),
//               native one-step plans; all_reduce, reduce_scatter and
//               all_gather; 1 or several chunks (so several lanes run at
//               once); every buffer routing the planner emits (packed work
//               buffer, stage 0 reading the input, the work buffer in the
//               output, in-place all_reduce beside the caller's tensor);
//               flight records read while runs go
//   shm + ring  ranks as threads, each with a GroupTransport holding
//               ShmComm host groups and in-process ring groups (the engine's
//               shm + gloo shape), every wait mode
//   shm fork    ShmComm's collectives across processes, and a member process
//               that exits in the middle of a call
//   call queue  the engine's queue (call_queue_test.cc): order, waits from
//               other threads, watch, close and cancel while items run
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/call.h"
#include "core/json.h"
#include "core/plan.h"
#include "core/types.h"
#include "device/device.h"
#include "executor/executor.h"
#include "kernels/reduce_cpu.h"
#include "transport/group.h"
#include "transport/inproc.h"
#include "transport/ucx.h"
#include "tests/check.h"
#include "transport/shm.h"

using namespace hocc;

namespace {

using hocc_test::Clock;
using hocc_test::g_checks;
using hocc_test::g_failures;
using hocc_test::since;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A host device whose buffers come from the heap: ASan then bounds every
// access to the executor's and the comms' scratch (CpuDevice maps pages of its
// own, whose ends ASan does not watch). Worlds alternate between the two.
class HeapDevice final : public Device {
 public:
  bool is_cuda() const override { return false; }
  void* alloc(size_t bytes) override { return ::operator new[](bytes ? bytes : 1, std::align_val_t(64)); }
  void free(void* p) override { ::operator delete[](p, std::align_val_t(64)); }
  void reduce(void* dst, const void* src, size_t n, DType t, RedOp op, void*) override {
    reduce_cpu(dst, src, n, t, op);
  }
  void zero(void* dst, size_t bytes, void*) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void divide(void* dst, size_t n, DType t, double divisor, void*) override { divide_cpu(dst, n, t, divisor); }
};

std::unique_ptr<Device> new_device(bool heap) {
  if (heap) return std::make_unique<HeapDevice>();
  return std::make_unique<CpuDevice>();
}

// ---------------------------------------------------------------- values

double get(DType t, const char* p, size_t i) {
  switch (t) {
    case DType::f32: { float v; std::memcpy(&v, p + i * 4, 4); return v; }
    case DType::f64: { double v; std::memcpy(&v, p + i * 8, 8); return v; }
    case DType::i32: { int32_t v; std::memcpy(&v, p + i * 4, 4); return v; }
    case DType::i64: { int64_t v; std::memcpy(&v, p + i * 8, 8); return double(v); }
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      const uint32_t u = uint32_t(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    default: std::abort();
  }
}

void put(DType t, char* p, size_t i, double v) {
  switch (t) {
    case DType::f32: { float x = float(v); std::memcpy(p + i * 4, &x, 4); return; }
    case DType::f64: { std::memcpy(p + i * 8, &v, 8); return; }
    case DType::i32: { int32_t x = int32_t(v); std::memcpy(p + i * 4, &x, 4); return; }
    case DType::i64: { int64_t x = int64_t(v); std::memcpy(p + i * 8, &x, 8); return; }
    case DType::bf16: {  // round to nearest even (the values here are exact)
      const float f = float(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      u += 0x7fffu + ((u >> 16) & 1u);
      const uint16_t h = uint16_t(u >> 16);
      std::memcpy(p + i * 2, &h, 2);
      return;
    }
    default: std::abort();
  }
}

// Small integers, so every reduction is exact in every dtype and any order.
double in_value(int rank, size_t i, RedOp op) {
  if (op == RedOp::prod) return double(1 + (size_t(rank) + i) % 2);
  return double(int((size_t(rank) * 7 + i * 13) % 17) - 8);
}

double fold(RedOp op, double a, double b) {
  switch (op) {
    case RedOp::sum: return a + b;
    case RedOp::prod: return a * b;
    case RedOp::min: return std::min(a, b);
    case RedOp::max: return std::max(a, b);
    case RedOp::none: return b;
  }
  return b;
}

const char* op_str(RedOp op, bool avg) {
  if (avg) return "avg";
  switch (op) {
    case RedOp::sum: return "sum";
    case RedOp::prod: return "prod";
    case RedOp::min: return "min";
    case RedOp::max: return "max";
    case RedOp::none: return "copy";
  }
  return "?";
}

struct Call {
  Op collective = Op::all_reduce;
  size_t count = 0;  // elements per block (per rank)
  DType t = DType::f32;
  RedOp op = RedOp::sum;
  bool avg = false;
  bool in_place = false;     // all_reduce: the output is the input
  bool caller_work = false;  // a work buffer from the caller (else the executor's own)
  std::string describe(int world) const {
    return std::string(op_name(collective)) + " of " + std::to_string(count) + " " + dtype_name(t) + " (" +
           op_str(op, avg) + ") over " + std::to_string(world) + " ranks" + (in_place ? ", in place" : "") +
           (caller_work ? ", caller's work buffer" : "");
  }
};

size_t in_elems(const Call& c, int world) {
  return c.collective == Op::reduce_scatter ? size_t(world) * c.count : c.count;
}
size_t out_elems(const Call& c, int world) {
  return c.collective == Op::all_gather ? size_t(world) * c.count : c.count;
}

// what rank `rank`'s output element i must be
double reference(const Call& c, int world, int rank, size_t i) {
  if (c.collective == Op::all_gather) return in_value(int(i / c.count), i % c.count, c.op);
  const size_t at = c.collective == Op::reduce_scatter ? size_t(rank) * c.count + i : i;
  double v = in_value(0, at, c.op);
  for (int q = 1; q < world; ++q) v = fold(c.op, v, in_value(q, at, c.op));
  if (!c.avg) return v;
  if (c.t == DType::f32) return double(float(v) / float(world));
  return v / double(world);
}

constexpr unsigned char kSentinel = 0x5a;

struct RankBuffers {
  std::vector<char> in, out, work;
  bool in_place = false;
  char* output() { return in_place ? in.data() : out.data(); }
  Buffers view() { return {in.data(), output(), work.empty() ? nullptr : work.data()}; }
};

std::vector<RankBuffers> make_buffers(const Call& c, int world, const Plan& plan) {
  const size_t es = dtype_size(c.t);
  std::vector<RankBuffers> bufs(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    RankBuffers& b = bufs[size_t(r)];
    b.in.assign(in_elems(c, world) * es, 0);
    for (size_t i = 0; i < in_elems(c, world); ++i) put(c.t, b.in.data(), i, in_value(r, i, c.op));
    b.in_place = c.in_place;
    if (!c.in_place) b.out.assign(out_elems(c, world) * es, char(kSentinel));
    if (c.caller_work && plan.work_at == WorkAt::scratch) b.work.assign(plan.layout.size() * es, char(0x77));
  }
  return bufs;
}

// the first wrong element of rank's output, or ""
std::string check_output(const Call& c, int world, int rank, RankBuffers& b) {
  const char* out = b.output();
  for (size_t i = 0; i < out_elems(c, world); ++i) {
    const double want = reference(c, world, rank, i), got = get(c.t, out, i);
    if (got != want)
      return "rank " + std::to_string(rank) + " element " + std::to_string(i) + " is " + std::to_string(got) +
             ", want " + std::to_string(want);
  }
  if (!c.in_place)  // the caller's input is only read
    for (size_t i = 0; i < in_elems(c, world); ++i)
      if (get(c.t, b.in.data(), i) != in_value(rank, i, c.op))
        return "rank " + std::to_string(rank) + " input element " + std::to_string(i) + " was written";
  return "";
}

// after a failed call of a plan that works in a private buffer: the caller's
// tensors are as they were
bool untouched(const Call& c, int world, int rank, RankBuffers& b) {
  for (size_t i = 0; i < in_elems(c, world); ++i)
    if (get(c.t, b.in.data(), i) != in_value(rank, i, c.op)) return false;
  for (char x : b.out)
    if (static_cast<unsigned char>(x) != kSentinel) return false;
  return true;
}

// ---------------------------------------------------------------- plans
// Plans are built as the planner does (hocc/plan/): a unit plan whose offsets
// count units, scaled to a size by Plan::scaled.

struct StepSpec {
  int stage;
  Op op;
  Impl impl;
  std::vector<GroupSlice> groups;  // offsets within one chunk, in units
};

// the K chunks' steps of one chunk's stages, chunk k at k * chunk_units
Plan emit(Op collective, int world, Layout layout, const std::vector<StepSpec>& stages, size_t chunk_units,
          bool stage0_input = false) {
  Plan p;
  p.collective = collective, p.world = world, p.layout = std::move(layout);
  p.stages = 0;
  for (const StepSpec& s : stages) p.stages = std::max(p.stages, s.stage + 1);
  for (int k = 0; k < p.layout.chunks; ++k)
    for (const StepSpec& spec : stages) {
      Step s;
      s.stage = spec.stage, s.chunk = k, s.op = spec.op, s.impl = spec.impl;
      if (stage0_input && spec.stage == 0) s.src = Buf::input;
      for (GroupSlice g : spec.groups) {
        g.offset += size_t(k) * chunk_units;
        s.groups.push_back(std::move(g));
      }
      p.add_step(std::move(s));
    }
  return p;
}

std::vector<int> iota(int n, int from = 0) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = from + i;
  return v;
}

// one flat ring over `order` (hocc/plan/ring.py, with chunks)
Plan flat_ring(Op c, const std::vector<int>& order, int chunks, Impl impl, bool stage0_input = false) {
  const int n = int(order.size());
  if (c == Op::all_reduce)
    return emit(c, n, Layout{1, 0, chunks, size_t(n), {0}},
                {{0, Op::reduce_scatter, impl, {{order, 0, 1}}}, {1, Op::all_gather, impl, {{order, 0, 1}}}},
                size_t(n), stage0_input);
  return emit(c, n, Layout{n, 0, chunks, 1, order}, {{0, c, impl, {{order, 0, 1}}}}, size_t(n), stage0_input);
}

// HO-Ring on a uniform grid of H hosts of G ranks (hocc/plan/ho_ring/)
Plan grid(Op c, int H, int G, int chunks, Impl host_impl, Impl rail_impl, bool stage0_input = false) {
  const int world = H * G;
  auto host = [&](int h) { return iota(G, h * G); };
  auto rail = [&](int i) {
    std::vector<int> r;
    for (int h = 0; h < H; ++h) r.push_back(h * G + i);
    return r;
  };
  std::vector<GroupSlice> hosts, rails;
  if (c == Op::all_reduce) {
    for (int h = 0; h < H; ++h) hosts.push_back({host(h), 0, 1});
    for (int i = 0; i < G; ++i) rails.push_back({rail(i), size_t(i), 1});
    return emit(c, world, Layout{1, 0, chunks, size_t(G), {0}},
                {{0, Op::reduce_scatter, host_impl, hosts}, {1, Op::all_reduce, rail_impl, rails},
                 {2, Op::all_gather, host_impl, hosts}},
                size_t(G), stage0_input);
  }
  std::vector<int> order;  // slot i*H + h: rank h*G + i
  for (int i = 0; i < G; ++i)
    for (int h = 0; h < H; ++h) order.push_back(h * G + i);
  for (int h = 0; h < H; ++h) hosts.push_back({host(h), 0, size_t(H)});
  for (int i = 0; i < G; ++i) rails.push_back({rail(i), size_t(i * H), 1});
  if (c == Op::reduce_scatter)
    return emit(c, world, Layout{world, 0, chunks, 1, order},
                {{0, c, host_impl, hosts}, {1, c, rail_impl, rails}}, size_t(world), stage0_input);
  return emit(c, world, Layout{world, 0, chunks, 1, order}, {{0, c, rail_impl, rails}, {1, c, host_impl, hosts}},
              size_t(world), stage0_input);
}

// HO-Ring on hosts of 3 and 2 ranks, as hocc.plan.ho_ring builds it: the
// rails overlap, so ranks 1, 3 and 4 are in two groups of one step
Plan uneven_3_2(Op c, int chunks, Impl impl) {
  if (c == Op::all_reduce) {
    const std::vector<GroupSlice> hosts{{{0, 1, 2}, 0, 2}, {{3, 4}, 0, 3}};
    const std::vector<GroupSlice> rails{{{0, 3}, 0, 2}, {{1, 4}, 3, 1}, {{1, 3}, 2, 1}, {{2, 4}, 4, 2}};
    return emit(c, 5, Layout{1, 0, chunks, 6, {0}},
                {{0, Op::reduce_scatter, impl, hosts}, {1, Op::all_reduce, impl, rails},
                 {2, Op::all_gather, impl, hosts}},
                6);
  }
  const Layout lay{8, 0, chunks, 1, {0, 3, 1, kPadBlock, 2, 4, kPadBlock, kPadBlock}};
  const std::vector<GroupSlice> hosts{{{0, 1, 2}, 0, 2}, {{3, 4}, 0, 4}};
  const std::vector<GroupSlice> rails{{{0, 3}, 0, 1}, {{2, 4}, 4, 1}, {{1, 3}, 2, 1}};
  if (c == Op::reduce_scatter) return emit(c, 5, lay, {{0, c, impl, hosts}, {1, c, impl, rails}}, 8);
  return emit(c, 5, lay, {{0, c, impl, rails}, {1, c, impl, hosts}}, 8);
}

// hocc/plan/native.py: one step from the caller's input to its output
Plan native(Op c, int world, size_t count) {
  Plan p;
  p.collective = c, p.world = world, p.stages = 1;
  const int blocks = c == Op::all_reduce ? 1 : world;
  p.layout = Layout{blocks, count, 1, count, iota(blocks)};
  p.work_at = WorkAt::none, p.pack = false;
  Step s;
  s.op = c, s.impl = Impl::native, s.src = Buf::input, s.dst = Buf::output;
  s.groups.push_back({iota(world), 0, count});
  p.add_step(std::move(s));
  return p;
}

// a unit plan at `count` elements per block
Plan sized(const Plan& unit, size_t count, WorkAt where = WorkAt::scratch, bool pack = true) {
  const size_t k = size_t(unit.chunks()), per_chunk = (count + k - 1) / k;
  const size_t factor = std::max<size_t>(1, (per_chunk + unit.layout.piece - 1) / unit.layout.piece);
  return unit.scaled(factor, count, where, pack);
}

// ---------------------------------------------------------------- ranks as threads

struct Outcome {
  std::vector<std::string> errors;  // per rank, "" when it succeeded
  std::vector<char> mismatch;       // per rank: its error was a MismatchError
  double seconds = 0;
  bool all_ok() const {
    for (const auto& e : errors)
      if (!e.empty()) return false;
    return true;
  }
  std::string first_error() const {
    for (size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty()) return "rank " + std::to_string(r) + ": " + errors[r];
    return "";
  }
};

// body(r) on a thread per rank (but `absent`); a failing rank calls on_error
Outcome on_threads(int n, const std::function<void(int)>& body, const std::function<void(const std::string&)>& on_error,
                   int absent = -1) {
  Outcome o;
  o.errors.resize(size_t(n));
  o.mismatch.assign(size_t(n), 0);
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    if (r != absent) threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const MismatchError& e) {
        o.errors[size_t(r)] = e.what();
        o.mismatch[size_t(r)] = 1;
        on_error(e.what());
      } catch (const std::exception& e) {
        o.errors[size_t(r)] = e.what();
        if (o.errors[size_t(r)].empty()) o.errors[size_t(r)] = "(empty error)";
        on_error(e.what());
      }
    });
  for (auto& th : threads) th.join();
  o.seconds = since(t0);
  return o;
}

// Reads every executor's flight records while runs go (Executor::records()
// and RunRecord are documented as safe from any thread during a run).
class RecordReader {
 public:
  explicit RecordReader(std::vector<Executor*> execs) : execs_(std::move(execs)), th_([this] { loop(); }) {}
  ~RecordReader() {
    stop_ = true;
    th_.join();
  }
  long reads() const { return reads_; }

 private:
  void loop() {
    unsigned turn = 0;
    while (!stop_) {
      for (Executor* e : execs_) {
        for (const auto& rec : e->records()) {
          reads_ += long(rec->steps().size() + rec->exchanges().size());
          (void)rec->end_ns();
          (void)rec->begin_ns();
          (void)rec->seq();
        }
        if (auto last = e->last_record()) reads_ += long(last->steps().size());
        if (++turn % 7 == 0) e->set_record(2 + turn % 2);  // resize the ring of kept records mid-run
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::vector<Executor*> execs_;
  std::atomic<bool> stop_{false};
  std::atomic<long> reads_{0};
  std::thread th_;  // last: starts once the rest is built
};

// One in-process world with an executor per rank (bindings.cc's InProcRunner, in C++).
struct InProc {
  std::unique_ptr<Device> dev;
  InProcWorld world;
  std::vector<std::unique_ptr<Executor>> ex;
  InProc(int n, bool heap, double timeout_s) : dev(new_device(heap)), world(n, *dev, timeout_s) {
    for (int r = 0; r < n; ++r) ex.push_back(std::make_unique<Executor>(world.rank(r)));
  }
  int size() const { return world.size(); }
  std::vector<Executor*> executors() {
    std::vector<Executor*> v;
    for (auto& e : ex) v.push_back(e.get());
    return v;
  }
};

struct Fault {
  int fail_rank = -1;    // throws before it starts
  int absent_rank = -1;  // never joins
  int slow_rank = -1;    // joins, then sleeps slow_s before its first step
  double slow_s = 0;
  int inject_rank = -1;  // Executor::inject_fault(inject_stage, "raise")
  int inject_stage = 0;
};

Outcome run_inproc(InProc& w, const std::function<const Plan&(int)>& plan_of, std::vector<RankBuffers>& bufs,
                   const Call& c, const Fault& f = {}, int64_t seq = -1) {
  w.world.reset();
  if (f.inject_rank >= 0) w.ex[size_t(f.inject_rank)]->inject_fault(f.inject_stage, "raise");
  return on_threads(
      w.size(),
      [&](int r) {
        if (r == f.fail_rank) throw Error("rank " + std::to_string(r) + " failed on purpose");
        if (r == f.slow_rank) {
          w.world.enter(r);
          std::this_thread::sleep_for(std::chrono::duration<double>(f.slow_s));
        }
        w.ex[size_t(r)]->run(plan_of(r), bufs[size_t(r)].view(), c.t, c.op, c.avg, nullptr, nullptr, seq);
      },
      [&](const std::string& why) { w.world.abort(why); }, f.absent_rank);
}

// Runs one call on every rank and checks every output; returns whether all was right.
bool check_call(InProc& w, const Plan& plan, const Call& c, const std::string& what, bool records = false) {
  auto bufs = make_buffers(c, w.size(), plan);
  std::unique_ptr<RecordReader> reader;
  if (records) {
    for (auto& e : w.ex) e->set_record(3);
    reader = std::make_unique<RecordReader>(w.executors());
  }
  Outcome o = run_inproc(w, [&](int) -> const Plan& { return plan; }, bufs, c, {}, 42);
  reader.reset();
  bool ok = o.all_ok();
  EXPECT(ok, what + ": " + c.describe(w.size()) + " failed: " + o.first_error());
  for (int r = 0; ok && r < w.size(); ++r) {
    const std::string wrong = check_output(c, w.size(), r, bufs[size_t(r)]);
    EXPECT(wrong.empty(), what + ": " + c.describe(w.size()) + ": " + wrong);
    ok = wrong.empty();
  }
  if (records && ok) {
    for (int r = 0; r < w.size(); ++r) {
      auto rec = w.ex[size_t(r)]->last_record();
      EXPECT(rec && rec->seq() == 42 && rec->end_ns() >= rec->begin_ns() && rec->end_ns() > 0,
             what + ": rank " + std::to_string(r) + " has no finished record");
      if (!rec) continue;
      bool ended = true;
      for (const auto& s : rec->steps()) ended = ended && s.end_ns >= s.begin_ns && s.end_ns > 0;
      EXPECT(ended, what + ": rank " + std::to_string(r) + "'s record has a step that never ended");
    }
    for (auto& e : w.ex) e->set_record(0);
  }
  return ok;
}

// dtype / op combinations, rotated through so that every family meets several
struct Kind {
  DType t;
  RedOp op;
  bool avg;
};
const Kind kKinds[] = {{DType::i32, RedOp::sum, false}, {DType::f32, RedOp::sum, true},
                       {DType::f32, RedOp::max, false}, {DType::i64, RedOp::prod, false},
                       {DType::bf16, RedOp::sum, false}, {DType::f64, RedOp::min, false}};
constexpr size_t kNumKinds = sizeof(kKinds) / sizeof(kKinds[0]);

void inproc_correctness() {
  const auto t0 = Clock::now();
  const Op ops[] = {Op::all_reduce, Op::reduce_scatter, Op::all_gather};
  struct Family {
    std::string name;
    int world;
    std::function<Plan(Op)> unit;
    bool heap;
  };
  const std::vector<Family> families = {
      {"ring 3, one chunk", 3, [](Op c) { return flat_ring(c, iota(3), 1, Impl::ring); }, true},
      {"ring 4, 3 chunks", 4, [](Op c) { return flat_ring(c, iota(4), 3, Impl::native); }, false},
      {"ring 5 shuffled, 2 chunks", 5, [](Op c) { return flat_ring(c, {4, 2, 0, 3, 1}, 2, Impl::ring); }, true},
      {"ho_ring 2x2, 3 chunks", 4, [](Op c) { return grid(c, 2, 2, 3, Impl::native, Impl::ring); }, false},
      {"ho_ring 3x2, 2 chunks", 6, [](Op c) { return grid(c, 3, 2, 2, Impl::ring, Impl::native); }, true},
      {"ho_ring 3+2, 1 chunk", 5, [](Op c) { return uneven_3_2(c, 1, Impl::ring); }, false},
      {"ho_ring 3+2, 4 chunks", 5, [](Op c) { return uneven_3_2(c, 4, Impl::native); }, true},
  };
  const size_t counts[] = {1, 7, 301};
  size_t turn = 0, runs = 0;
  for (const Family& fam : families) {
    InProc w(fam.world, fam.heap, 60.0);
    for (Op op : ops) {
      const Plan unit = fam.unit(op);
      for (size_t count : counts) {
        const Kind& k = kKinds[turn++ % kNumKinds];
        Call c;
        c.collective = op, c.count = count, c.t = k.t;
        c.op = op == Op::all_gather ? RedOp::sum : k.op;
        c.avg = op != Op::all_gather && k.avg;
        c.caller_work = turn % 2 == 0;
        const bool rec = turn % 3 == 0;
        check_call(w, sized(unit, count), c, fam.name, rec);
        ++runs;
      }
    }
  }
  // the buffer routings of hocc.plan.buffers, where the layout is the identity
  {
    InProc w(4, true, 60.0);
    Call c;
    c.count = 4 * 3 * 5, c.t = DType::f32;  // 3 chunks of 20, unpadded: stage 0 reads the caller's input
    check_call(w, sized(flat_ring(Op::all_reduce, iota(4), 3, Impl::ring, true), c.count, WorkAt::scratch, false), c,
               "all_reduce, stage 0 from the input");
    c.in_place = true;
    check_call(w, sized(flat_ring(Op::all_reduce, iota(4), 3, Impl::ring, true), c.count, WorkAt::scratch, false), c,
               "in-place all_reduce, stage 0 from the input");
    c.collective = Op::reduce_scatter, c.in_place = false, c.count = 33, c.t = DType::i32;
    check_call(w, sized(flat_ring(Op::reduce_scatter, iota(4), 1, Impl::ring, true), c.count, WorkAt::scratch, false),
               c, "reduce_scatter, stage 0 from the input");
    c.collective = Op::all_gather;
    check_call(w, sized(flat_ring(Op::all_gather, iota(4), 1, Impl::ring), c.count, WorkAt::output, true), c,
               "all_gather into the output");
    runs += 4;
  }
  // native one-step plans, input to output, no work buffer; an in-place
  // all_reduce then runs beside the caller's tensor and is copied back
  for (int world : {2, 3, 5}) {
    InProc w(world, world != 3, 60.0);
    for (Op op : ops)
      for (size_t count : {size_t(1), size_t(45)}) {
        Call c;
        c.collective = op, c.count = count, c.t = count == 1 ? DType::f64 : DType::i32;
        check_call(w, native(op, world, count), c, "native", true);
        ++runs;
        if (op == Op::all_reduce) {
          c.in_place = true;
          check_call(w, native(op, world, count), c, "native in place");
          ++runs;
        }
      }
  }
  // trace mode: every step from one thread per rank in wavefront order, each timed
  {
    InProc w(4, false, 60.0);
    for (auto& e : w.ex) e->set_trace(true);
    Call c;
    c.count = 150, c.t = DType::f32;
    check_call(w, sized(grid(Op::all_reduce, 2, 2, 3, Impl::ring, Impl::native), c.count), c, "trace mode", true);
    const auto timings = w.ex[1]->take_timings();
    EXPECT(timings.size() == 9, "trace mode: " + std::to_string(timings.size()) + " step timings, want 9");
    for (auto& e : w.ex) e->set_trace(false);
    ++runs;
  }
  // calls above the executor's always-kept work buffer (4 MiB): kept while calls of their size repeat,
  // released once kKeepRuns small calls in a row did not need it, on both devices
  for (bool heap : {false, true}) {
    InProc w(2, heap, 60.0);
    Call c;
    const size_t big = (size_t(4) << 20) / 4 + 1001;
    for (int i = 0; i < 2; ++i) {
      c.count = big, c.t = DType::i32;
      check_call(w, sized(flat_ring(Op::all_reduce, iota(2), 2, Impl::ring), c.count), c, "large all_reduce");
      EXPECT(w.ex[0]->held_bytes() > (size_t(4) << 20), "the executor let go of a buffer in repeated use");
      EXPECT(w.ex[0]->held_bytes() <= 2 * big * 4, "the executor holds more than its last call's layout");
      ++runs;
    }
    for (int i = 0; i < Executor::kKeepRuns; ++i) {
      c.count = 99;
      check_call(w, sized(flat_ring(Op::all_reduce, iota(2), 2, Impl::ring), c.count), c, "small after large");
      ++runs;
    }
    EXPECT(w.ex[0]->held_bytes() <= (size_t(4) << 20), "the executor holds more than 4 MiB after small calls");
  }
  std::printf("  in-process correctness: %zu calls checked (%.1f s)\n", runs, since(t0));
}

// concurrent runs of one cached plan in two worlds at once: Plan::for_rank
// compiles each rank's part on first use, from every world's threads
// ---------------------------------------------------------------- the planner's plans
// tests/fixtures/plans/*.json: plans hocc's planner emitted for several topologies, algorithms, sizes and
// K (tests/test_plan_fixtures.py writes them and checks that they are current), read by plan_from_json
// as the bindings read every plan, and checked on in-process ranks.
void planner_plans(const std::string& dir) {
  const auto t0 = Clock::now();
  std::vector<std::string> files;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) files.push_back(dir + "/" + name);
    }
    ::closedir(d);
  }
  std::sort(files.begin(), files.end());
  EXPECT(!files.empty(), "no plan fixtures in " + dir + " (run from the repository's root)");
  int plans = 0;
  size_t kind = 0;
  for (const std::string& path : files) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    Json doc;
    try {
      doc = parse_json(text.str());
    } catch (const std::exception& e) {
      EXPECT(false, path + ": " + e.what());
      continue;
    }
    const int world = int(doc.at("world").integer());
    InProc w(world, plans % 2 == 0, 10.0);
    for (const Json& jp : doc.at("plans").array()) {
      const Plan plan = plan_from_json(jp);
      const Kind& k = kKinds[kind++ % kNumKinds];
      Call c;
      c.collective = plan.collective, c.count = size_t(jp.at("count").integer());
      c.t = k.t, c.op = k.op, c.avg = k.avg;
      c.in_place = plan.collective == Op::all_reduce && plan.work_at == WorkAt::output;
      check_call(w, plan, c, path + " plan " + std::to_string(plans) + " (" + jp.at("algo").text() + ")");
      ++plans;
    }
  }
  std::printf("  the planner's plans: %d from %zu fixture files checked (%.1f s)\n", plans, files.size(), since(t0));
}

void shared_plan() {
  const auto t0 = Clock::now();
  const Plan plan = sized(uneven_3_2(Op::all_reduce, 3, Impl::ring), 200);
  Call c;
  c.count = 200, c.t = DType::f32, c.op = RedOp::sum;
  std::vector<std::thread> worlds;
  for (int i = 0; i < 2; ++i)
    worlds.emplace_back([&, i] {
      InProc w(5, i == 0, 60.0);
      for (int rep = 0; rep < 3; ++rep) check_call(w, plan, c, "one plan, two worlds at once");
    });
  for (auto& th : worlds) th.join();
  std::printf("  one plan run by two worlds at once (%.1f s)\n", since(t0));
}

void inproc_faults() {
  const auto t0 = Clock::now();
  // a rank that never comes is given up on after this; failures must come sooner, through the abort
  const double timeout = 2.0;
  InProc w(5, true, timeout);
  const Plan plan = sized(uneven_3_2(Op::all_reduce, 3, Impl::ring), 120);
  Call c;
  c.count = 120, c.t = DType::f32;
  auto same = [&](int) -> const Plan& { return plan; };

  {  // a rank fails before it starts: every other rank fails too, soon, and leaves its tensors alone
    auto bufs = make_buffers(c, 5, plan);
    Fault f;
    f.fail_rank = 2;
    Outcome o = run_inproc(w, same, bufs, c, f);
    for (int r = 0; r < 5; ++r) {
      EXPECT(!o.errors[size_t(r)].empty(), "fail_rank: rank " + std::to_string(r) + " did not fail");
      EXPECT(untouched(c, 5, r, bufs[size_t(r)]), "fail_rank: rank " + std::to_string(r) + "'s tensors changed");
    }
    EXPECT(contains(o.errors[2], "failed on purpose"), "fail_rank: " + o.errors[2]);
    EXPECT(o.seconds < timeout, "fail_rank: peers took " + std::to_string(o.seconds) + " s, not the abort");
    for (const auto& e : o.errors) EXPECT(!contains(e, "timed out"), "fail_rank: " + e);
  }
  {  // a fault injected mid-plan (stage 1, several lanes running): the same, and the fault names itself
    auto bufs = make_buffers(c, 5, plan);
    Fault f;
    f.inject_rank = 3, f.inject_stage = 1;
    Outcome o = run_inproc(w, same, bufs, c, f);
    for (int r = 0; r < 5; ++r) {
      EXPECT(!o.errors[size_t(r)].empty(), "inject: rank " + std::to_string(r) + " did not fail");
      EXPECT(untouched(c, 5, r, bufs[size_t(r)]), "inject: rank " + std::to_string(r) + "'s tensors changed");
    }
    EXPECT(contains(o.errors[3], "fault injected at stage 1"), "inject: " + o.errors[3]);
    EXPECT(o.seconds < timeout, "inject: peers took " + std::to_string(o.seconds) + " s, not the abort");
    for (const auto& e : o.errors) EXPECT(!contains(e, "timed out"), "inject: " + e);
  }
  // an all_reduce that works in the caller's tensor (identity layout, nothing packed: Executor::Journal),
  // in place: a fault after earlier stages wrote into it leaves every rank's tensor as it was
  for (int stage : {1, 2}) {
    Call cj = c;
    cj.count = 126, cj.in_place = true;  // 3 chunks of 42: unpadded
    const Plan in_output = sized(uneven_3_2(Op::all_reduce, 3, Impl::ring), cj.count, WorkAt::scratch, false);
    EXPECT(in_output.layout.size() == cj.count, "journal: the plan is padded, so it would not work in the tensor");
    auto bufs = make_buffers(cj, 5, in_output);
    Fault f;
    f.inject_rank = 3, f.inject_stage = stage;
    Outcome o = run_inproc(w, [&](int) -> const Plan& { return in_output; }, bufs, cj, f);
    const std::string at = "journal, stage " + std::to_string(stage) + ": rank ";
    for (int r = 0; r < 5; ++r) {
      EXPECT(!o.errors[size_t(r)].empty(), at + std::to_string(r) + " did not fail");
      EXPECT(untouched(cj, 5, r, bufs[size_t(r)]), at + std::to_string(r) + "'s tensor changed");
    }
    check_call(w, in_output, cj, "journal, after its fault");
  }
  // the world recovers: the same executors and comms run the next call right
  check_call(w, plan, c, "after the faults");
  {  // a rank never comes: its peers time out, naming it
    auto bufs = make_buffers(c, 5, plan);
    Fault f;
    f.absent_rank = 4;
    Outcome o = run_inproc(w, same, bufs, c, f);
    for (int r = 0; r < 4; ++r)
      EXPECT(!o.errors[size_t(r)].empty(), "absent: rank " + std::to_string(r) + " did not fail");
    EXPECT(contains(o.first_error(), "timed out") || contains(o.first_error(), "a peer failed"),
           "absent: " + o.first_error());
    bool named = false;
    for (const auto& e : o.errors) named = named || (contains(e, "timed out") && contains(e, "rank 4"));
    EXPECT(named, "absent: no timeout names rank 4: " + o.first_error());
    EXPECT(o.seconds < 5 * timeout, "absent: took " + std::to_string(o.seconds) + " s");
  }
  check_call(w, plan, c, "after a timeout");
  {  // a slow rank (inside the timeout) only delays the call
    auto bufs = make_buffers(c, 5, plan);
    Fault f;
    f.slow_rank = 1, f.slow_s = timeout / 4;
    Outcome o = run_inproc(w, same, bufs, c, f);
    EXPECT(o.all_ok(), "slow rank: " + o.first_error());
    for (int r = 0; o.all_ok() && r < 5; ++r) {
      const std::string wrong = check_output(c, 5, r, bufs[size_t(r)]);
      EXPECT(wrong.empty(), "slow rank: " + wrong);
    }
  }
  {  // ranks run plans of different sizes: an error on every rank, no hang
    const Plan bigger = sized(uneven_3_2(Op::all_reduce, 3, Impl::ring), 240);
    Call cb = c;
    cb.count = 240;
    std::vector<RankBuffers> bufs = make_buffers(c, 5, plan), big = make_buffers(cb, 5, bigger);
    bufs[0] = std::move(big[0]);
    Outcome o = run_inproc(w, [&](int r) -> const Plan& { return r == 0 ? bigger : plan; }, bufs, c);
    for (int r = 0; r < 5; ++r)
      EXPECT(!o.errors[size_t(r)].empty(), "sizes differ: rank " + std::to_string(r) + " did not fail");
    bool said = false;
    for (const auto& e : o.errors) said = said || contains(e, "disagree on a segment's size");
    EXPECT(said, "sizes differ: no rank says so: " + o.first_error());
    EXPECT(o.seconds < timeout, "sizes differ: took " + std::to_string(o.seconds) + " s");
  }
  {  // bad plans fail on every rank before any byte moves
    Plan bad;
    bad.world = 5, bad.stages = 1, bad.layout = Layout{1, 4, 1, 4, {0}};
    Step s;
    s.stage = 3;  // outside the plan's one stage
    s.groups.push_back({iota(5), 0, 4});
    bad.add_step(s);
    Call cs = c;
    cs.count = 4;
    auto bufs = make_buffers(cs, 5, bad);
    Outcome o = run_inproc(w, [&](int) -> const Plan& { return bad; }, bufs, cs);
    for (int r = 0; r < 5; ++r) EXPECT(contains(o.errors[size_t(r)], "outside the plan"), "bad plan: " + o.errors[size_t(r)]);
    InProc w3(3, false, timeout);
    Outcome o3 = run_inproc(w3, same, bufs, cs);  // a plan for 5 ranks on 3
    for (int r = 0; r < 3; ++r) EXPECT(contains(o3.errors[size_t(r)], "plan is for 5 ranks"), "wrong world: " + o3.errors[size_t(r)]);
  }
  check_call(w, plan, c, "after the errors");
  std::printf("  in-process faults: fail, inject, absent (timeout), slow, size mismatch, bad plans (%.1f s)\n",
              since(t0));
}

// ---------------------------------------------------------------- shared memory + rings

std::string shm_dir() {
  struct stat st;
  if (::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && ::access("/dev/shm", W_OK) == 0) return "/dev/shm";
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

// A segment file as hocc/engine/shm.py makes one (zeroed, the size ShmComm asks for).
class ShmFile {
 public:
  ShmFile(int n, size_t half_bytes) {
    static std::atomic<int> counter{0};
    path_ = shm_dir() + "/hocc-sanitize-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw Error("cannot create " + path_ + ": " + std::strerror(errno));
    const int rc = ::ftruncate(fd, off_t(ShmComm::segment_bytes(n, half_bytes)));
    ::close(fd);
    if (rc != 0) throw Error("cannot size " + path_ + ": " + std::strerror(errno));
  }
  ~ShmFile() { ::unlink(path_.c_str()); }
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An in-process ring comm as a GroupTransport member (the engine registers
// gloo comms there; here the ring groups' bytes move through an InProcWorld).
class ForwardComm final : public Comm {
 public:
  ForwardComm(InProcWorld& world, Comm& inner) : Comm(inner.me, inner.n), world_(world), inner_(inner) {}
  void exchange(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                const Lane& lane) override {
    inner_.exchange(send, send_n, recv, recv_n, t, op, lane);
  }
  void abort(const std::string& why) override { world_.abort(why); }

 private:
  InProcWorld& world_;
  Comm& inner_;
};

constexpr size_t kHalf = 4096;  // the smallest slot half: calls stream through many pieces

// Ranks as threads, each a GroupTransport (its own device) holding a ShmComm
// per 'shm' group and an in-process comm per other group of the plans given
// (with `ucx`, a UcxComm per 'ring' group instead: the rails between hosts).
struct Hybrid {
  int n;
  double timeout_s;
  WaitMode mode;
  bool ucx = false;
  std::unique_ptr<Device> ring_dev;
  InProcWorld world;
  std::vector<std::unique_ptr<GroupTransport>> tr;
  std::vector<std::unique_ptr<Executor>> ex;

  Hybrid(int n_, double timeout, WaitMode m, bool heap, const std::vector<const Plan*>& plans, bool ucx_ = false)
      : n(n_), timeout_s(timeout), mode(m), ucx(ucx_), ring_dev(new_device(!heap)), world(n_, *ring_dev, timeout) {
    for (int r = 0; r < n; ++r) tr.push_back(std::make_unique<GroupTransport>(r, n, new_device(heap)));
    for (const Plan* p : plans) add_comms(*p);
    for (int r = 0; r < n; ++r) ex.push_back(std::make_unique<Executor>(*tr[size_t(r)]));
  }

  void add_comms(const Plan& plan) {
    std::vector<std::unique_ptr<ShmFile>> files;  // unlinked once every member has mapped it
    for (const Step& s : plan.steps())
      for (const GroupSlice& g : s.groups) {
        if (g.ranks.size() < 2 || tr[size_t(g.ranks[0])]->has(s.stage, g.ranks, s.impl)) continue;
        if (s.impl == Impl::shm) files.push_back(std::make_unique<ShmFile>(int(g.ranks.size()), kHalf));
        const int k = int(g.ranks.size());
        std::vector<std::shared_ptr<UcxComm>> rails;  // the group's UCX comms, connected below
        for (size_t m = 0; m < g.ranks.size(); ++m) {
          const int r = g.ranks[m];
          std::shared_ptr<Comm> comm;
          if (s.impl == Impl::shm) {
            comm = std::make_shared<ShmComm>(files.back()->path(), int(m), k, kHalf, timeout_s, mode);
          } else if (ucx && s.impl == Impl::ring) {
            rails.push_back(std::make_shared<UcxComm>(int(m), k, timeout_s, 50.0));
            comm = rails.back();
          } else {
            comm = std::make_shared<ForwardComm>(world, world.rank(r).comm(s.stage, g.ranks, s.impl));
          }
          tr[size_t(r)]->add(s.stage, g.ranks, s.impl, std::move(comm));
        }
        std::vector<std::string> addresses;  // as hocc/engine/ucx.py does with the addresses from the store
        for (auto& rail : rails) addresses.push_back(rail->address());
        for (auto& rail : rails) rail->connect(addresses);
      }
  }

  // calls[r]: what rank r says the call is (null: no check)
  Outcome run(const Plan& plan, std::vector<RankBuffers>& bufs, const Call& c, const std::vector<CallId>* calls,
              int absent = -1, int inject_rank = -1, int inject_stage = 0) {
    world.reset();
    if (inject_rank >= 0) ex[size_t(inject_rank)]->inject_fault(inject_stage, "raise");
    return on_threads(
        n,
        [&](int r) {
          ex[size_t(r)]->run(plan, bufs[size_t(r)].view(), c.t, c.op, c.avg, nullptr,
                             calls ? &(*calls)[size_t(r)] : nullptr);
        },
        // as the engine does: a failed rank's transport aborts (ShmComm: the shared flag); with UCX, as its
        // watchdog does too (hocc/engine/watchdog.py: the failure published on the store), every rank's
        [&](const std::string& why) {
          if (ucx)
            for (auto& t : tr) t->abort("rank failed: " + why);
        },
        absent);
  }
};

std::vector<CallId> call_ids(int n, uint64_t seq, const Call& c) {
  const std::string collective = op_name(c.collective);
  return std::vector<CallId>(size_t(n), make_call_id(seq, 0x1234, int64_t(c.count), collective, dtype_name(c.t),
                                                     op_str(c.op, c.avg), "ho_ring"));
}

bool check_hybrid(Hybrid& h, const Plan& plan, const Call& c, uint64_t seq, const std::string& what) {
  auto bufs = make_buffers(c, h.n, plan);
  const auto calls = call_ids(h.n, seq, c);
  Outcome o = h.run(plan, bufs, c, &calls);
  EXPECT(o.all_ok(), what + ": " + c.describe(h.n) + " failed: " + o.first_error());
  if (!o.all_ok()) return false;
  for (int r = 0; r < h.n; ++r) {
    const std::string wrong = check_output(c, h.n, r, bufs[size_t(r)]);
    EXPECT(wrong.empty(), what + ": " + c.describe(h.n) + ": " + wrong);
    if (!wrong.empty()) return false;
  }
  return true;
}

const char* mode_name(WaitMode m) {
  switch (m) {
    case WaitMode::futex: return "futex";
    case WaitMode::yield: return "yield";
    case WaitMode::hybrid: return "hybrid";
    case WaitMode::sleep: return "sleep";
  }
  return "?";
}

void shm_threads() {
  const auto t0 = Clock::now();
  size_t runs = 0;
  // HO-Ring 2x2 with shared-memory host stages and in-process rails, 3 chunks:
  // a rank's three lanes wait in two ShmComms and a ring at once
  for (WaitMode mode : {WaitMode::futex, WaitMode::hybrid, WaitMode::yield, WaitMode::sleep}) {
    const Plan ar = sized(grid(Op::all_reduce, 2, 2, 3, Impl::shm, Impl::ring), 9000);
    const Plan rs = sized(grid(Op::reduce_scatter, 2, 2, 2, Impl::shm, Impl::ring), 1500);
    const Plan ag = sized(grid(Op::all_gather, 2, 2, 2, Impl::shm, Impl::ring), 1500);
    Hybrid h(4, 60.0, mode, mode == WaitMode::futex || mode == WaitMode::yield, {&ar, &rs, &ag});
    uint64_t seq = 0;
    Call c;
    c.count = 9000, c.t = DType::f32, c.avg = true;
    check_hybrid(h, ar, c, ++seq, std::string("shm+ring all_reduce, ") + mode_name(mode));
    c.collective = Op::reduce_scatter, c.count = 1500, c.t = DType::i32, c.avg = false;
    check_hybrid(h, rs, c, ++seq, std::string("shm+ring reduce_scatter, ") + mode_name(mode));
    c.collective = Op::all_gather, c.t = DType::bf16;
    check_hybrid(h, ag, c, ++seq, std::string("shm+ring all_gather, ") + mode_name(mode));
    c.collective = Op::all_reduce, c.count = 9000, c.t = DType::i64, c.op = RedOp::prod, c.in_place = true;
    check_hybrid(h, ar, c, ++seq, std::string("shm+ring in-place all_reduce, ") + mode_name(mode));
    runs += 4;
  }
  // one host of 4 through shared memory alone, several chunks on one lane,
  // each collective (reduce_scatter into the caller's output, as torch's form)
  {
    Plan ar = sized(flat_ring(Op::all_reduce, iota(4), 1, Impl::shm), 2500);
    const Plan rs = sized(flat_ring(Op::reduce_scatter, iota(4), 3, Impl::shm), 900);
    const Plan ag = sized(flat_ring(Op::all_gather, iota(4), 3, Impl::shm), 900);
    Plan rs_out;
    rs_out.collective = Op::reduce_scatter, rs_out.world = 4, rs_out.stages = 1;
    rs_out.layout = Layout{4, 900, 1, 900, iota(4)};
    rs_out.work_at = WorkAt::none, rs_out.pack = false;
    Step s;
    s.op = Op::reduce_scatter, s.impl = Impl::shm, s.src = Buf::input, s.dst = Buf::output;
    s.groups.push_back({iota(4), 0, 900});
    rs_out.add_step(s);
    Hybrid h(4, 60.0, WaitMode::futex, true, {&ar, &rs, &ag, &rs_out});
    Call c;
    c.count = 2500, c.t = DType::f32, c.op = RedOp::max;
    check_hybrid(h, ar, c, 1, "shm all_reduce");
    c.collective = Op::reduce_scatter, c.count = 900, c.t = DType::f64, c.op = RedOp::sum;
    check_hybrid(h, rs, c, 2, "shm reduce_scatter, 3 chunks");
    check_hybrid(h, rs_out, c, 3, "shm reduce_scatter into the output");
    c.collective = Op::all_gather, c.t = DType::i32;
    check_hybrid(h, ag, c, 4, "shm all_gather, 3 chunks");
    runs += 4;
  }
  std::printf("  shared memory + rings on threads: %zu calls checked, 4 wait modes (%.1f s)\n", runs, since(t0));
}

// The UCX rails (transport/ucx.cc) under ASan: HO-Ring 2x2 with shared-memory
// host stages and UCX rails, each collective and the tiny all_reduce's gather,
// then a fault on one rank mid-plan: every rank raises, none hangs, and the
// group stays failed. The TSan build has no UCX (its library is not
// instrumented, so every access of its own would be a report): it says so.
void ucx_threads() {
  const std::string why = ucx_unavailable();
  if (!why.empty()) {
    std::printf("  UCX: not in this build (%s)\n", why.c_str());
    return;
  }
  const auto t0 = Clock::now();
  size_t runs = 0;
  const Plan ar = sized(grid(Op::all_reduce, 2, 2, 3, Impl::shm, Impl::ring), 9000);
  const Plan rs = sized(grid(Op::reduce_scatter, 2, 2, 2, Impl::shm, Impl::ring), 1500);
  const Plan ag = sized(grid(Op::all_gather, 2, 2, 2, Impl::shm, Impl::ring), 1500);
  const Plan tiny = sized(flat_ring(Op::all_reduce, iota(4), 1, Impl::ring), 5);
  {
    Hybrid h(4, 60.0, WaitMode::futex, true, {&ar, &rs, &ag, &tiny}, true);
    uint64_t seq = 0;
    Call c;
    c.count = 9000, c.t = DType::f32, c.avg = true;
    check_hybrid(h, ar, c, ++seq, "shm+ucx all_reduce");
    c.collective = Op::reduce_scatter, c.count = 1500, c.t = DType::i32, c.avg = false;
    check_hybrid(h, rs, c, ++seq, "shm+ucx reduce_scatter");
    c.collective = Op::all_gather, c.t = DType::bf16;
    check_hybrid(h, ag, c, ++seq, "shm+ucx all_gather");
    c.collective = Op::all_reduce, c.count = 5, c.t = DType::f64, c.op = RedOp::max;
    check_hybrid(h, tiny, c, ++seq, "ucx tiny all_reduce (gathered)");
    runs += 4;
  }
  {  // three members: Bruck's all-gather with a last step of fewer blocks than held (n not a power of two)
    const Plan ag3 = sized(flat_ring(Op::all_gather, iota(3), 1, Impl::ring), 7);
    const Plan ar3 = sized(flat_ring(Op::all_reduce, iota(3), 1, Impl::ring), 11);
    Hybrid h(3, 60.0, WaitMode::futex, true, {&ag3, &ar3}, true);
    Call c;
    c.collective = Op::all_gather, c.count = 7, c.t = DType::f32;
    check_hybrid(h, ag3, c, 1, "ucx small all_gather of 3 (Bruck)");
    c.collective = Op::all_reduce, c.count = 11, c.t = DType::i32;
    check_hybrid(h, ar3, c, 2, "ucx tiny all_reduce of 3 (Bruck)");
    runs += 2;
  }
  // A fault injected on rank 1 in the rails' stage: every rank fails, and fails again at once after. Its
  // closed endpoints alone do not end a neighbour's wait (a forced close leaves the socket to UCX's progress,
  // which the failed rank no longer makes: its neighbour waits out the timeout); the watchdog's abort does.
  {
    Hybrid h(4, 30.0, WaitMode::futex, true, {&ar}, true);
    Call c;
    c.count = 9000, c.t = DType::f32;
    auto bufs = make_buffers(c, 4, ar);
    Outcome o = h.run(ar, bufs, c, nullptr, -1, 1, 1);
    for (int r = 0; r < 4; ++r) {
      EXPECT(!o.errors[size_t(r)].empty(), "ucx inject: rank " + std::to_string(r) + " did not fail");
      EXPECT(untouched(c, 4, r, bufs[size_t(r)]), "ucx inject: rank " + std::to_string(r) + "'s tensors changed");
    }
    EXPECT(o.seconds < 10, "ucx inject: took " + std::to_string(o.seconds) + " s");
    const auto t1 = Clock::now();
    Outcome again = h.run(ar, bufs, c, nullptr);
    EXPECT(!again.all_ok() && since(t1) < 10, "ucx after a failure: " + again.first_error());
    runs += 2;
  }
  std::printf("  UCX %s rails on threads: %zu calls checked (%.1f s)\n", ucx_version().c_str(), runs, since(t0));
}

void shm_faults() {
  const auto t0 = Clock::now();
  const Plan ar = sized(grid(Op::all_reduce, 2, 2, 3, Impl::shm, Impl::ring), 3000);
  Call c;
  c.count = 3000, c.t = DType::f32;
  const double timeout = 30.0;  // long: failures must come from the abort, not from waiting it out
  {  // a fault injected on one rank mid-plan: every rank fails at once, through the shared abort flag and the ring
    for (int stage : {0, 1, 2}) {
      Hybrid h(4, timeout, WaitMode::futex, true, {&ar});
      auto bufs = make_buffers(c, 4, ar);
      Outcome o = h.run(ar, bufs, c, nullptr, -1, 1, stage);
      for (int r = 0; r < 4; ++r) {
        // at the last stage the other host (ranks 2, 3) needs nothing more of rank 1: where all its chunks had
        // left the rails before the fault, it ends with the right sum, which is no failed call's data
        const bool may_finish = stage == 2 && r >= 2 && o.errors[size_t(r)].empty();
        if (may_finish) {
          const std::string wrong = check_output(c, 4, r, bufs[size_t(r)]);
          EXPECT(wrong.empty(), "shm inject at stage 2: rank " + std::to_string(r) + " finished wrong: " + wrong);
          continue;
        }
        EXPECT(!o.errors[size_t(r)].empty(),
               "shm inject at stage " + std::to_string(stage) + ": rank " + std::to_string(r) + " did not fail");
        EXPECT(untouched(c, 4, r, bufs[size_t(r)]), "shm inject: rank " + std::to_string(r) + "'s tensors changed");
      }
      EXPECT(contains(o.errors[1], "fault injected"), "shm inject: " + o.errors[1]);
      EXPECT(o.seconds < 5, "shm inject at stage " + std::to_string(stage) + ": took " + std::to_string(o.seconds) + " s");
      // the host groups stay failed: the next call fails at once, it does not wait
      const auto t1 = Clock::now();
      Outcome again = h.run(ar, bufs, c, nullptr);
      EXPECT(!again.all_ok() && since(t1) < 5, "shm after a failure: " + again.first_error());
    }
  }
  {  // a member never comes: the others time out naming it
    const Plan host = sized(flat_ring(Op::all_reduce, iota(3), 1, Impl::shm), 500);
    Hybrid h(3, 0.5, WaitMode::hybrid, false, {&host});
    Call c3 = c;
    c3.count = 500;
    auto bufs = make_buffers(c3, 3, host);
    Outcome o = h.run(host, bufs, c3, nullptr, 2);
    // the first to time out names the missing member; a peer may instead see the abort flag it set
    bool named = false;
    for (int r = 0; r < 2; ++r) {
      EXPECT(!o.errors[size_t(r)].empty(), "shm absent: rank " + std::to_string(r) + " did not fail");
      named = named || (contains(o.errors[size_t(r)], "timed out") && contains(o.errors[size_t(r)], "rank 2"));
    }
    EXPECT(named, "shm absent: no timeout names rank 2: " + o.first_error());
    EXPECT(o.seconds < 5, "shm absent: took " + std::to_string(o.seconds) + " s");
  }
  {  // the ranks disagree on the call: every rank raises MismatchError, then the group stays failed
    const Plan host = sized(flat_ring(Op::all_reduce, iota(4), 2, Impl::shm), 800);
    Hybrid h(4, timeout, WaitMode::futex, true, {&host});
    Call c4 = c;
    c4.count = 800;
    auto bufs = make_buffers(c4, 4, host);
    auto calls = call_ids(4, 7, c4);
    calls[2].count += 1;
    Outcome o = h.run(host, bufs, c4, &calls);
    for (int r = 0; r < 4; ++r) {
      EXPECT(o.mismatch[size_t(r)], "shm mismatch: rank " + std::to_string(r) + ": " + o.errors[size_t(r)]);
      EXPECT(untouched(c4, 4, r, bufs[size_t(r)]), "shm mismatch: rank " + std::to_string(r) + "'s tensors changed");
    }
    EXPECT(contains(o.errors[0], "count 801"), "shm mismatch: " + o.errors[0]);
    EXPECT(o.seconds < 5, "shm mismatch: took " + std::to_string(o.seconds) + " s");
  }
  {  // ... and when they agree, the check passes call after call (both call slots in turn)
    const Plan host = sized(flat_ring(Op::all_reduce, iota(3), 2, Impl::shm), 300);
    Hybrid h(3, timeout, WaitMode::futex, false, {&host});
    Call c3 = c;
    c3.count = 300;
    for (uint64_t seq = 1; seq <= 4; ++seq) check_hybrid(h, host, c3, seq, "shm agreed calls");
  }
  std::printf("  shared-memory faults: inject per stage, absent member (timeout), call mismatch (%.1f s)\n",
              since(t0));
}

// ---------------------------------------------------------------- shared memory across processes

// One member's ShmComm collectives, checked; returns whether all were right.
bool shm_member(const std::string& path, int me, int n) {
  HeapDevice dev;
  Lane lane{nullptr, &dev};
  ShmComm comm(path, me, n, kHalf, 30.0, me == 1 ? WaitMode::sleep : WaitMode::futex);
  bool ok = true;
  auto expect = [&](bool cond, const std::string& what) {
    ok = ok && cond;
    EXPECT(cond, "process member " + std::to_string(me) + ": " + what);
  };
  {  // all_reduce into another buffer, 3 pieces
    Call c;
    c.count = 2500, c.t = DType::i32;
    std::vector<char> in(c.count * 4), out(c.count * 4);
    for (size_t i = 0; i < c.count; ++i) put(c.t, in.data(), i, in_value(me, i, c.op));
    comm.all_reduce(in.data(), out.data(), c.count, c.t, c.op, lane);
    for (size_t i = 0; i < c.count && ok; ++i) expect(get(c.t, out.data(), i) == reference(c, n, me, i), "all_reduce");
  }
  {  // in place, max
    Call c;
    c.count = 1700, c.t = DType::f32, c.op = RedOp::max;
    std::vector<char> buf(c.count * 4);
    for (size_t i = 0; i < c.count; ++i) put(c.t, buf.data(), i, in_value(me, i, c.op));
    comm.all_reduce(buf.data(), buf.data(), c.count, c.t, c.op, lane);
    for (size_t i = 0; i < c.count && ok; ++i) expect(get(c.t, buf.data(), i) == reference(c, n, me, i), "all_reduce in place");
  }
  {  // reduce_scatter in place and into an output
    Call c;
    c.collective = Op::reduce_scatter, c.count = 700, c.t = DType::f64;
    std::vector<char> buf(size_t(n) * c.count * 8), out(c.count * 8);
    for (size_t i = 0; i < size_t(n) * c.count; ++i) put(c.t, buf.data(), i, in_value(me, i, c.op));
    comm.reduce_scatter_out(buf.data(), out.data(), c.count, c.t, c.op, lane);
    for (size_t i = 0; i < c.count && ok; ++i) expect(get(c.t, out.data(), i) == reference(c, n, me, i), "reduce_scatter_out");
    comm.reduce_scatter(buf.data(), buf.data(), c.count, c.t, c.op, lane);
    const char* mine = buf.data() + size_t(me) * c.count * 8;
    for (size_t i = 0; i < c.count && ok; ++i) expect(get(c.t, mine, i) == reference(c, n, me, i), "reduce_scatter");
  }
  {  // all_gather
    Call c;
    c.collective = Op::all_gather, c.count = 1500, c.t = DType::i32;
    std::vector<char> in(c.count * 4), out(size_t(n) * c.count * 4);
    for (size_t i = 0; i < c.count; ++i) put(c.t, in.data(), i, in_value(me, i, c.op));
    comm.all_gather(in.data(), out.data(), c.count, c.t, lane);
    for (size_t i = 0; i < size_t(n) * c.count && ok; ++i)
      expect(get(c.t, out.data(), i) == reference(c, n, me, i), "all_gather");
  }
  return ok;
}

// One member of a host group running a plan through an executor; `exit_at_stage0`:
// it exits as a crashing process would on reaching its first step (Executor's "exit" fault).
// Returns whether what happened was what was due.
bool shm_dying_group_member(const std::string& path0, const std::string& path1, int me, int n, bool exit_at_stage0) {
  GroupTransport t(me, n, std::make_unique<CpuDevice>());
  t.add(0, iota(n), Impl::shm, std::make_shared<ShmComm>(path0, me, n, kHalf, 30.0, WaitMode::futex));
  t.add(1, iota(n), Impl::shm, std::make_shared<ShmComm>(path1, me, n, kHalf, 30.0, WaitMode::futex));
  Executor ex(t);
  const Plan plan = sized(flat_ring(Op::all_reduce, iota(n), 1, Impl::shm), 1000);
  Call c;
  c.count = 1000, c.t = DType::f32;
  auto bufs = make_buffers(c, n, plan);
  if (exit_at_stage0) ex.inject_fault(0, "exit");
  const auto t0 = Clock::now();
  try {
    ex.run(plan, bufs[size_t(me)].view(), c.t, c.op, false);
  } catch (const std::exception& e) {
    const std::string why = e.what();
    // the liveness check names the dead member; a peer may instead see the abort flag the first one set
    const bool ok = ((contains(why, "died") && contains(why, "rank 2")) || contains(why, "its error is raised on")) &&
                    since(t0) < 10;
    EXPECT(ok, "process member " + std::to_string(me) + " (" + std::to_string(since(t0)) + " s): " + why);
    EXPECT(untouched(c, n, me, bufs[size_t(me)]), "process member " + std::to_string(me) + "'s tensors changed");
    return ok;
  }
  EXPECT(false, "process member " + std::to_string(me) + ": the call succeeded without its dead peer");
  return false;
}

void alarm_handler(int) {
  static const char msg[] = "\nhocc sanitize: the test hung (alarm): a rank never returned\n";
  [[maybe_unused]] ssize_t w = ::write(2, msg, sizeof msg - 1);
  std::_Exit(124);
}

// fork n-1 children running member(m) for m = 1..n-1, run member(0) here, reap them
void fork_group(int n, const std::function<bool(int)>& member, const std::vector<int>& want_exit,
                const std::string& what) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> kids;
  for (int m = 1; m < n; ++m) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      EXPECT(false, what + ": fork failed: " + std::strerror(errno));
      continue;
    }
    if (pid == 0) {
      alarm(60);  // alarms are not inherited
      const bool ok = member(m);
      std::fflush(nullptr);
      std::exit(ok ? 0 : 1);  // exit(): the sanitizers' end-of-process checks run in the child too
    }
    kids.push_back(pid);
  }
  EXPECT(member(0), what + ": member 0 failed");
  for (size_t i = 0; i < kids.size(); ++i) {
    int status = 0;
    const pid_t got = ::waitpid(kids[i], &status, 0);
    const int code = got == kids[i] && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    EXPECT(code == want_exit[i], what + ": member " + std::to_string(i + 1) + " ended with " +
                                     (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                                          : "exit " + std::to_string(code)) +
                                     ", want exit " + std::to_string(want_exit[i]));
  }
}

void shm_processes() {
  const auto t0 = Clock::now();
  {
    ShmFile f(3, kHalf);
    fork_group(3, [&](int m) { return shm_member(f.path(), m, 3); }, {0, 0}, "shm across processes");
  }
  {  // member 2 exits inside its call; its peers fail within the 100 ms liveness check, not the 30 s timeout
    ShmFile f0(3, kHalf), f1(3, kHalf);  // the plan's two stages
    fork_group(3, [&](int m) { return shm_dying_group_member(f0.path(), f1.path(), m, 3, m == 2); }, {0, 3},
               "a dead member process");
  }
  std::printf("  shared memory across processes: collectives, a member that dies mid-call (%.1f s)\n", since(t0));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--probe") return 0;  // the Makefile checks the sanitizer starts
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ::signal(SIGALRM, alarm_handler);
  alarm(240);
  const auto t0 = Clock::now();
  std::printf("hocc C++ core under sanitizers\n");
  try {
    shm_processes();  // first, while this process has one thread (fork)
    inproc_correctness();
    planner_plans("tests/fixtures/plans");  // make runs it from the repository root
    shared_plan();
    inproc_faults();
    shm_threads();
    shm_faults();
    ucx_threads();
    hocc_test::call_queue_checks();
  } catch (const std::exception& e) {
    EXPECT(false, std::string("unexpected exception: ") + e.what());
  }
  const long failures = g_failures.load();
  std::printf("%s: %ld checks, %ld failed (%.1f s)\n", failures ? "FAILED" : "OK", g_checks.load(), failures,
              since(t0));
  return failures ? 1 : 0;
}
