#include "executor/executor.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "executor/layout.h"
#include "transport/ring.h"

namespace hocc {

struct Executor::Run {
  const char* input;
  char* output;
  char* work;
  DType t;
  RedOp op;
  const Step* steps;  // the plan's first step (a record names steps by index)
  size_t scale;       // the plan's: its offsets and segments count units of this many elements
  RunRecord* rec;     // null: not recording
  Journal* journal;   // null: the steps write no caller's tensor before the run succeeded
  char* buf(Buf b) const { return b == Buf::work ? work : b == Buf::output ? output : const_cast<char*>(input); }
};

// Where a sync all_reduce works in the caller's output itself (its work buffer
// is the output element for element): each chunk's region is copied aside
// before this rank's first write to it, and copied back if the run fails, so a
// failed call still leaves the caller's tensors as they were. The copies run
// inside the pipeline, while the links carry other chunks, where a private
// work buffer needs one copy of the whole result after the last step, which
// every rank of a host makes at the same time (on the emulated 2x4 at 1 Gbit/s,
// four ranks on one core: the last 2-3 ms of a 4 MiB call).
struct Executor::Journal {
  char* caller;       // the caller's output (the run's work buffer)
  char* aside;        // the saved regions, at the same offsets
  size_t chunk_bytes, total_bytes;
  std::unique_ptr<std::atomic<bool>[]> saved;  // per chunk
  int chunks;

  Journal(char* caller, char* aside, const Layout& l, size_t es)
      : caller(caller), aside(aside), chunk_bytes(l.piece * es), total_bytes(l.size() * es),
        saved(new std::atomic<bool>[size_t(l.chunks)]()), chunks(l.chunks) {}

  // before a step of chunk k writes bytes [lo, hi): save what it may overwrite (every chunk, should a step
  // reach beyond its own: the guarantee does not rest on the plan's shape)
  void before_write(int k, size_t lo, size_t hi) {
    const bool inside = k >= 0 && k < chunks && lo >= size_t(k) * chunk_bytes && hi <= size_t(k + 1) * chunk_bytes;
    if (inside) return save(k);
    for (int j = 0; j < chunks; ++j) save(j);
  }
  void save(int k) {
    if (!saved[size_t(k)].exchange(true)) copy_chunk(k, aside, caller);
  }
  // after a failure, every lane stopped: the caller's output as it was
  void restore() {
    for (int k = 0; k < chunks; ++k)
      if (saved[size_t(k)].load()) copy_chunk(k, caller, aside);
  }
  void copy_chunk(int k, char* to, const char* from) const {
    const size_t off = size_t(k) * chunk_bytes;
    std::memcpy(to + off, from + off, std::min(chunk_bytes, total_bytes - off));
  }
};

void* Executor::lane_stream(int stage) {
  while (int(streams_.size()) <= stage) streams_.push_back(t_.device().new_stream());
  return streams_[stage];
}

void Executor::set_record(size_t keep) {
  std::lock_guard<std::mutex> lk(rec_mu_);
  keep_ = keep;
  while (runs_.size() > keep_) runs_.pop_front();
}

std::vector<std::shared_ptr<RunRecord>> Executor::records() const {
  std::lock_guard<std::mutex> lk(rec_mu_);
  return {runs_.begin(), runs_.end()};
}

std::shared_ptr<RunRecord> Executor::last_record() const {
  std::lock_guard<std::mutex> lk(rec_mu_);
  return runs_.empty() ? nullptr : runs_.back();
}

std::vector<StepTiming> Executor::take_timings() {
  std::vector<StepTiming> out;
  out.swap(timings_);
  return out;
}

void Executor::inject_fault(int stage, const std::string& action, std::function<void()> hook) {
  if (action != "raise" && action != "kill" && action != "stop" && action != "exit" && action != "call")
    throw Error("hocc: unknown fault '" + action + "'; use raise, kill, stop, exit or call");
  if ((action == "call") != bool(hook)) throw Error("hocc: a 'call' fault takes a hook, and only it does");
  fault_action_ = action;
  fault_hook_ = std::move(hook);
  fault_stage_.store(stage);  // after the action: a lane that sees the stage sees its action
}

namespace {

// inject_fault's action, on reaching its stage (tests and the fault matrix)
void fire_fault(const std::string& action, const std::function<void()>& hook, int stage) {
  if (action == "kill") ::raise(SIGKILL);
  if (action == "stop") ::raise(SIGSTOP);
  if (action == "exit") std::_Exit(3);
  if (action == "call") {  // e.g. cut this host's link, then go on with the step
    hook();
  } else {
    throw Error("hocc: a fault injected at stage " + std::to_string(stage));
  }
}

}  // namespace

void Executor::run_item(const Item& it, const Run& r, const Lane& lane) {
  const Step& s = *it.step;
  // every lane thread checks; the one that disarms it fires it (atomic: lanes of other stages read it meanwhile)
  int armed = fault_stage_.load();
  bool fire = s.stage == armed && fault_stage_.compare_exchange_strong(armed, -1);
  for (const GroupSlice* g : it.groups) {
    try {
      if (fire) {  // in the step's first group: its failure is this step's
        fire = false;
        fire_fault(fault_action_, fault_hook_, s.stage);
      }
      Lane l = lane;
      if (r.rec) {
        l.rec = r.rec;
        l.step_rec = r.rec->begin_step(int32_t(&s - r.steps), int32_t(g - s.groups.data()));
      }
      if (r.journal && s.dst != Buf::input) {
        const size_t unit = r.scale * dtype_size(r.t);
        r.journal->before_write(s.chunk, g->offset * unit, (g->offset + s.region_units(*g)) * unit);
      }
      run_group(s, *g, r, l);
      if (r.rec) r.rec->end_step(l.step_rec);
    } catch (const std::exception& e) {
      Where at{s.stage, s.chunk, std::string(impl_name(s.impl)) + " " + op_name(s.op), g->ranks, s.tier};
      const std::string context = at.text() + ": ";
      rethrow_at(std::move(at), context, e);
    }
  }
}

void Executor::run_group(const Step& s, const GroupSlice& gs, const Run& r, const Lane& lane) {
  const size_t es = dtype_size(r.t);
  const GroupSlice* g = &gs;
  const size_t off = g->offset * r.scale * es, seg = g->seg * r.scale;
  const char* src = r.buf(s.src) + off;
  char* dst = r.buf(s.dst) + off;
  if (g->ranks.size() == 1) {  // alone: the result is the input, wherever the plan wants it
    if (s.op == Op::all_gather && s.src == Buf::input) src = r.input;
    if (s.op == Op::reduce_scatter && s.dst == Buf::output) dst = r.output;
    copy_in(src, dst, seg, r.t, lane);
    return;
  }
  Comm& c = t_.comm(s.stage, g->ranks, s.impl);
  const bool ring = s.impl == Impl::ring;
  switch (s.op) {
    case Op::all_reduce:
      ring ? ring_all_reduce(c, src, dst, seg, r.t, r.op, lane) : c.all_reduce(src, dst, seg, r.t, r.op, lane);
      break;
    case Op::reduce_scatter:
      if (s.dst == Buf::output)  // torch.distributed's form: our segment only, into the caller's output
        c.reduce_scatter_out(src, r.output, seg, r.t, r.op, lane);
      else if (ring)
        ring_reduce_scatter(c, src, dst, seg, r.t, r.op, lane);
      else
        c.reduce_scatter(src, dst, seg, r.t, r.op, lane);
      break;
    case Op::all_gather:
      // our segment: the caller's input as a whole, or our segment of the region
      src = s.src == Buf::input ? r.input : src + size_t(c.me) * seg * es;
      ring ? ring_all_gather(c, src, dst, seg, r.t, lane) : c.all_gather(src, dst, seg, r.t, lane);
      break;
    case Op::broadcast:  // member 0's region to every member, in place
      copy_in(src, dst, seg, r.t, lane);
      ring ? ring_broadcast(c, dst, seg, r.t, lane) : c.broadcast(dst, seg, r.t, lane);
      break;
  }
}

void Executor::run(const Plan& plan, const Buffers& bufs, DType t, RedOp op, bool average, void* caller_stream,
                   const CallId* call, int64_t seq) {
  if (plan.world != t_.size())
    throw Error("hocc: plan is for " + std::to_string(plan.world) + " ranks but the transport has " +
                std::to_string(t_.size()));
  Device& dev = t_.device();
  const size_t es = dtype_size(t), n = plan.layout.size(), count = plan.layout.block_elems;
  // In a sync run a failure leaves the caller's tensors as they were (a check frame can fail after our own
  // segment, or a neighbour's, is in): an all_reduce whose work buffer would be its output element for
  // element works in the output, each chunk saved before its first write and put back on failure (Journal);
  // any other plan whose steps would write the output (a work buffer there, or none, as native's) runs into
  // the executor's buffer, copied out at the end. Not on an async transport: failures surface on its stream
  const size_t out_elems = plan.collective == Op::all_gather ? n : count;
  const bool in_output = !t_.async() && !dev.is_cuda() && plan.collective == Op::all_reduce &&
                         plan.work_at == WorkAt::scratch && !plan.pack && n && n == count && bufs.output;
  const bool beside = !t_.async() && out_elems && bufs.output && plan.work_at != WorkAt::scratch;
  const size_t need = beside ? out_elems * es : plan.work_at == WorkAt::scratch && n && !bufs.work ? n * es : 0;
  keep_or_release_work(need);
  char* output = beside ? work_.at_least(out_elems * es, dev) : static_cast<char*>(bufs.output);
  char* work = plan.work_at == WorkAt::output ? output
               : plan.work_at == WorkAt::scratch ? static_cast<char*>(bufs.work)
                                                 : nullptr;
  if (plan.work_at == WorkAt::scratch && n && !work) work = work_.at_least(n * es, dev);
  if (plan.work_at != WorkAt::none && n && !work) throw Error("hocc: the plan needs a work buffer and got none");
  if (count && (!bufs.input || !bufs.output)) throw Error("hocc: no input or output buffer given");
  std::unique_ptr<Journal> journal;
  if (in_output) {
    journal = std::make_unique<Journal>(output, work, plan.layout, es);
    work = output;
  }
  std::shared_ptr<RunRecord> rec;
  {
    std::lock_guard<std::mutex> lk(rec_mu_);
    if (keep_) {
      rec = std::make_shared<RunRecord>(seq);
      runs_.push_back(rec);
      if (runs_.size() > keep_) runs_.pop_front();
    }
  }
  Run r{static_cast<const char*>(bufs.input), output, work, t, op, plan.steps().data(), plan.scale, rec.get(),
        journal.get()};
  t_.prepare(plan);
  if (call) t_.begin(*call);
  if (plan.pack && n) pack(plan, t_.rank(), r.input, work, es, dev, caller_stream);
  try {
    if (trace_ || t_.async())
      run_wavefront(plan, r, caller_stream, trace_);
    else
      run_threads(plan, r, caller_stream);
  } catch (...) {
    if (journal) journal->restore();  // every lane has stopped (run_threads joins them; the others run here)
    throw;
  }
  if (plan.work_at == WorkAt::scratch && !journal) unpack(plan, t_.rank(), work, r.output, es, dev, caller_stream);
  if (average && plan.collective != Op::all_gather) dev.divide(r.output, count, t, double(plan.world), caller_stream);
  if (beside) dev.reduce(bufs.output, output, out_elems, t, RedOp::none, caller_stream);
  if (!t_.async()) dev.sync(caller_stream);
  // On a GPU the work buffer goes back after every run, to torch's allocator on the caller's stream
  // (ordered after the run): a buffer kept for the next call could be packed by a call on another stream
  // while this one's unpack is still pending. On the host it stays for the next calls (keep_or_release_work).
  if (t_.async()) work_.release();
  if (rec) rec->end();
}

void Executor::keep_or_release_work(size_t need) {
  if (work_.size() <= kKeepWork || need * 2 > work_.size()) {
    small_runs_ = 0;  // small, or about the size this run needs: kept
    return;
  }
  if (++small_runs_ >= kKeepRuns) {  // calls have not needed it for a while: back to the OS
    work_.release();
    small_runs_ = 0;
  }
}

void Executor::run_wavefront(const Plan& plan, const Run& r, void* caller_stream, bool timed) {
  Device& dev = t_.device();
  const RankSteps& lanes = plan.for_rank(t_.rank());
  // every event this run records, destroyed on the way out (CUDA keeps a
  // destroyed event's pending waits valid); on CPU there are none
  std::vector<void*> events;
  struct Release {
    Device& dev;
    std::vector<void*>& events;
    ~Release() {
      for (void* e : events) dev.free_event(e);
    }
  } release{dev, events};
  auto record = [&](void* stream) { return events.emplace_back(dev.record(stream)); };
  if (timed) dev.sync(caller_stream);  // a step's time is its own, not the packing's
  void* start = record(caller_stream);
  // done[s][k]: event recorded after this rank's steps (s, k) on stage s's stream
  std::vector<std::vector<void*>> done(plan.stages, std::vector<void*>(plan.chunks(), nullptr));
  std::vector<size_t> next(plan.stages, 0);
  std::vector<bool> started(plan.stages, false);
  try {
    for (int tick = 0; tick < plan.chunks() + plan.stages - 1; ++tick) {
      for (int s = 0; s < plan.stages; ++s) {
        int k = tick - s;
        if (k < 0 || k >= plan.chunks() || next[s] >= lanes[s].size() || lanes[s][next[s]].step->chunk != k) continue;
        Lane lane{lane_stream(s), &dev};
        if (!started[s]) {
          dev.wait(lane.stream, start);
          started[s] = true;
        }
        for (int p = s - 1; p >= 0; --p)  // the nearest earlier stage this rank ran for chunk k
          if (done[p][k]) {
            dev.wait(lane.stream, done[p][k]);
            break;
          }
        while (next[s] < lanes[s].size() && lanes[s][next[s]].step->chunk == k) {
          const Item& it = lanes[s][next[s]++];
          auto t0 = std::chrono::steady_clock::now();
          run_item(it, r, lane);
          if (timed) {
            dev.sync(lane.stream);
            timings_.push_back({s, k, it.step->op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
          }
        }
        done[s][k] = record(lane.stream);
      }
    }
  } catch (const std::exception& e) {
    t_.abort(e.what());
    throw;
  }
  for (int s = 0; s < plan.stages; ++s)
    if (started[s]) dev.wait(caller_stream, record(lane_stream(s)));
}

void Executor::run_threads(const Plan& plan, const Run& r, void* caller_stream) {
  Device& dev = t_.device();
  dev.sync(caller_stream);  // the caller's writes and the packing are done
  const RankSteps& lanes = plan.for_rank(t_.rank());
  // left[s][k]: this rank's steps (s, k) not yet ended; a step waits for the
  // nearest earlier stage of its chunk that this rank has steps in
  std::vector<std::vector<int>> left(plan.stages, std::vector<int>(plan.chunks(), 0));
  for (int s = 0; s < plan.stages; ++s)
    for (const Item& it : lanes[s]) ++left[s][it.step->chunk];
  auto dependency = [&](int s, int k) {
    for (int p = s - 1; p >= 0; --p)
      if (left[p][k]) return p;
    return -1;
  };
  std::vector<std::vector<int>> dep(plan.stages, std::vector<int>(plan.chunks(), -1));
  for (int s = 0; s < plan.stages; ++s)  // before any step ends, while left[][] says who has steps
    for (int k = 0; k < plan.chunks(); ++k) dep[s][k] = dependency(s, k);
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;  // the first failure, on any lane (raised again here: its kind and fields kept)

  auto lane_main = [&](int s) {
    Lane lane{lane_stream(s), &dev};
    try {
      for (const Item& it : lanes[s]) {
        const int k = it.step->chunk, p = dep[s][k];
        {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return error || p < 0 || left[p][k] == 0; });
          if (error) return;
        }
        run_item(it, r, lane);
        dev.sync(lane.stream);
        std::lock_guard<std::mutex> lk(mu);
        --left[s][k];
        cv.notify_all();
      }
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lk(mu);
        if (!error) error = std::current_exception();
        cv.notify_all();
      }
      t_.abort(e.what());
    }
  };
  lane_stream(plan.stages - 1);  // create every lane's stream before the threads share the list
  if (plan.chunks() == 1) {
    // one chunk: every stage waits for the one before, so the stages run here in order (a thread per
    // stage would cost two thread switches per stage and gain nothing)
    for (int s = 0; s < plan.stages; ++s) lane_main(s);
  } else {
    std::vector<std::thread> threads;
    for (int s = 1; s < plan.stages; ++s)
      if (!lanes[s].empty()) threads.emplace_back(lane_main, s);
    lane_main(0);
    for (auto& th : threads) th.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace hocc
