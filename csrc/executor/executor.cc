#include "executor/executor.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "transport/ring.h"

namespace hocc {

Executor::~Executor() {
  for (void* s : streams_)
    if (s) t_.device().free_stream(s);
}

void* Executor::lane_stream(int stage) {
  while (int(streams_.size()) <= stage) streams_.push_back(t_.device().new_stream());
  return streams_[stage];
}

std::vector<std::vector<Executor::Mine>> Executor::my_steps(const Plan& plan) const {
  std::vector<std::vector<Mine>> lanes(plan.stages);
  for (const Step& s : plan.steps) {
    if (s.stage < 0 || s.stage >= plan.stages || s.chunk < 0 || s.chunk >= plan.chunks)
      throw Error("hocc: plan step (stage " + std::to_string(s.stage) + ", chunk " + std::to_string(s.chunk) +
                  ") is outside the plan's " + std::to_string(plan.stages) + " stages x " +
                  std::to_string(plan.chunks) + " chunks");
    const GroupSlice* g = s.group_of(t_.rank());
    if (g && g->ranks.size() > 1) lanes[s.stage].push_back({&s, g});
  }
  for (auto& lane : lanes)
    for (size_t i = 1; i < lane.size(); ++i)
      if (lane[i].step->chunk <= lane[i - 1].step->chunk)
        throw Error("hocc: plan has two steps for one (stage, chunk) of this rank, or steps out of chunk order");
  return lanes;
}

void Executor::run_step(const Mine& m, char* work, DType t, RedOp op, const Lane& lane) {
  const Step& s = *m.step;
  const GroupSlice& g = *m.group;
  Comm& c = t_.comm(s.stage, g.ranks);
  char* base = work + g.offset * dtype_size(t);
  if (s.impl == Impl::ring) {
    switch (s.op) {
      case Op::reduce_scatter: return ring_reduce_scatter(c, base, g.seg, t, op, lane);
      case Op::all_gather: return ring_all_gather(c, base, g.seg, t, lane);
      case Op::all_reduce: return ring_all_reduce(c, base, g.seg, t, op, lane);
    }
  }
  switch (s.op) {
    case Op::reduce_scatter: return c.reduce_scatter(base, g.seg, t, op, lane);
    case Op::all_gather: return c.all_gather(base, g.seg, t, lane);
    case Op::all_reduce: return c.all_reduce(base, g.seg, t, op, lane);
  }
}

void Executor::run(const Plan& plan, void* work, DType t, RedOp op, void* caller_stream) {
  if (plan.world != t_.size())
    throw Error("hocc: plan is for " + std::to_string(plan.world) + " ranks but the transport has " +
                std::to_string(t_.size()));
  if (plan.work_elems && !work) throw Error("hocc: no work buffer given");
  t_.prepare(plan);
  if (t_.async())
    run_async(plan, static_cast<char*>(work), t, op, caller_stream);
  else
    run_threads(plan, static_cast<char*>(work), t, op, caller_stream);
}

void Executor::run_async(const Plan& plan, char* work, DType t, RedOp op, void* caller_stream) {
  Device& dev = t_.device();
  auto lanes = my_steps(plan);
  // every event this run records, destroyed on the way out (CUDA keeps a
  // destroyed event's pending waits valid)
  std::vector<void*> events;
  struct Release {
    Device& dev;
    std::vector<void*>& events;
    ~Release() {
      for (void* e : events) dev.free_event(e);
    }
  } release{dev, events};
  auto record = [&](void* stream) { return events.emplace_back(dev.record(stream)); };
  void* start = record(caller_stream);
  // done[s][k]: event recorded after step (s, k) on stage s's stream
  std::vector<std::vector<void*>> done(plan.stages, std::vector<void*>(plan.chunks, nullptr));
  std::vector<size_t> next(plan.stages, 0);
  std::vector<bool> started(plan.stages, false);
  for (int tick = 0; tick < plan.chunks + plan.stages - 1; ++tick) {
    for (int s = 0; s < plan.stages; ++s) {
      int k = tick - s;
      if (k < 0 || k >= plan.chunks || next[s] >= lanes[s].size() || lanes[s][next[s]].step->chunk != k) continue;
      Lane lane{lane_stream(s)};
      if (!started[s]) {
        dev.wait(lane.stream, start);
        started[s] = true;
      }
      // the previous stage of this chunk (or, if this rank had none, the nearest earlier one)
      for (int p = s - 1; p >= 0; --p)
        if (done[p][k]) {
          dev.wait(lane.stream, done[p][k]);
          break;
        }
      run_step(lanes[s][next[s]++], work, t, op, lane);
      done[s][k] = record(lane.stream);
    }
  }
  for (int s = 0; s < plan.stages; ++s)
    if (started[s]) dev.wait(caller_stream, record(lane_stream(s)));
}

void Executor::run_threads(const Plan& plan, char* work, DType t, RedOp op, void* caller_stream) {
  Device& dev = t_.device();
  dev.sync(caller_stream);  // the caller's writes to `work` are done
  auto lanes = my_steps(plan);
  // a step waits for this rank's nearest earlier stage of the same chunk
  std::vector<std::vector<bool>> have(plan.stages, std::vector<bool>(plan.chunks, false));
  for (int s = 0; s < plan.stages; ++s)
    for (const Mine& m : lanes[s]) have[s][m.step->chunk] = true;
  auto dependency = [&](int s, int k) {
    for (int p = s - 1; p >= 0; --p)
      if (have[p][k]) return p;
    return -1;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<bool>> done(plan.stages, std::vector<bool>(plan.chunks, false));
  std::string error;

  auto lane_main = [&](int s) {
    Lane lane{lane_stream(s)};
    try {
      for (const Mine& m : lanes[s]) {
        const int k = m.step->chunk, p = dependency(s, k);
        {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return !error.empty() || p < 0 || done[p][k]; });
          if (!error.empty()) return;
        }
        run_step(m, work, t, op, lane);
        dev.sync(lane.stream);
        std::lock_guard<std::mutex> lk(mu);
        done[s][k] = true;
        cv.notify_all();
      }
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lk(mu);
        if (error.empty()) error = e.what();
        cv.notify_all();
      }
      t_.abort(e.what());
    }
  };
  lane_stream(plan.stages - 1);  // create every lane's stream before the threads share the list
  std::vector<std::thread> threads;
  for (int s = 1; s < plan.stages; ++s)
    if (!lanes[s].empty()) threads.emplace_back(lane_main, s);
  lane_main(0);
  for (auto& th : threads) th.join();
  if (!error.empty()) throw Error(error);
}

}  // namespace hocc
