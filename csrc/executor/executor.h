// Runs a plan for one rank over a Transport, from the caller's input to the
// caller's output: pack, the steps, AVG's division, unpack. Decides nothing.
//
// Each pipeline stage is a lane. Step (s, k) starts after this rank's nearest
// earlier stage of chunk k ended; a lane runs its steps in chunk order, so
// stages overlap across chunks. A rank may belong to several groups of one
// step: it runs them in the order listed (the same on every rank).
//   async transports (NCCL): one host thread enqueues every step in wavefront
//     order (the same order on every rank, so communicators never wait on each
//     other in opposite orders) on its stage's stream, with CUDA events for the
//     dependencies; pack and unpack run on the caller's stream. Never blocks.
//   blocking transports (in-process, shared memory, c10d): one thread per
//     stage, handing chunks on through done flags; the first failure aborts
//     the transport so peers fail instead of waiting, and is rethrown.
// Trace mode runs the steps one at a time, in wavefront order (the async path,
// on any transport: blocking comms cannot deadlock in one global order), and times each.
// A failing step's error names its stage, chunk, op and group; the transport
// is then aborted (Transport::abort) so that peers fail instead of waiting.
#pragma once

#include <atomic>
#include <functional>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/plan.h"
#include "core/record.h"
#include "core/types.h"
#include "transport/transport.h"

namespace hocc {

// The caller's tensors and the work buffer (plan.layout.size() elements; only
// read where plan.work_at is scratch; null: the executor's own). All on the
// transport's device.
struct Buffers {
  const void* input = nullptr;
  void* output = nullptr;
  void* work = nullptr;
};

struct StepTiming {
  int stage, chunk;
  Op op;
  double seconds;
};

class Executor {
 public:
  // the work buffer's bounds (keep_or_release_work, below)
  static constexpr size_t kKeepWork = size_t(4) << 20;
  static constexpr int kKeepRuns = 8;
  explicit Executor(Transport& t) : t_(t) {}
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // average: divide the result by the group size (AVG runs as SUM);
  // caller_stream (CUDA) orders the run after the caller's work and the
  // caller's later work after the run
  // call: what every member must agree on (core/call.h; null: not checked)
  // seq: the engine's call number, kept in the run's record (-1: none)
  void run(const Plan& plan, const Buffers& bufs, DType dtype, RedOp op, bool average,
           void* caller_stream = nullptr, const CallId* call = nullptr, int64_t seq = -1);
  // For fault tests: in the next run, on reaching a step of `stage`, this rank
  // fails as `action` says: "raise" (an error here), "kill" (SIGKILL itself),
  // "stop" (SIGSTOP itself), "exit" (exits at once, as a crashing process) or
  // "call" (calls `hook`, e.g. a test's cut of this host's link, then goes on;
  // what it throws is the step's failure). No shell: the library runs no command.
  void inject_fault(int stage, const std::string& action, std::function<void()> hook = nullptr);
  void set_trace(bool on) { trace_ = on; }
  // bytes of work buffer held between calls (keep_or_release_work says how many)
  size_t held_bytes() const { return work_.size(); }
  std::vector<StepTiming> take_timings();
  // Flight recorder (core/record.h): each run notes when this rank began and
  // ended it and each of its steps and ring exchanges; the executor keeps the
  // latest `keep` runs' records (0: records nothing), so the caller's path
  // never handles them. Both calls are safe from any thread, while a run goes.
  void set_record(size_t keep);
  std::vector<std::shared_ptr<RunRecord>> records() const;  // oldest first
  std::shared_ptr<RunRecord> last_record() const;

 private:
  using Item = MyStep;
  struct Run;      // one call's buffers and types
  struct Journal;  // the caller's output saved aside where a run works in it
  void run_item(const Item& it, const Run& r, const Lane& lane);
  void run_group(const Step& s, const GroupSlice& g, const Run& r, const Lane& lane);
  // every step from this thread in wavefront order, lanes ordered by events (async transports: never
  // blocks; trace mode: one step at a time, each timed)
  void run_wavefront(const Plan& plan, const Run& r, void* caller_stream, bool timed);
  void run_threads(const Plan& plan, const Run& r, void* caller_stream);
  void* lane_stream(int stage);

  // The work buffer a plan needs when the caller gives none. On CPU it stays
  // between calls while they keep needing it: a fresh mapping of a large call's
  // size costs its page faults and zeroing on every call (+15-45% at 16-64 MiB).
  // One above kKeepWork goes back to the OS once kKeepRuns runs in a row needed
  // less than half of it, so what the executor holds between calls is at most
  // the largest buffer of its last kKeepRuns calls, or kKeepWork. On a GPU it is
  // released after every run (torch's caching allocator keeps that cheap).
  void keep_or_release_work(size_t need);  // before a run that needs `need` bytes of it
  Scratch work_;
  int small_runs_ = 0;  // runs in a row that needed less than half of a work buffer above kKeepWork
  Transport& t_;
  std::vector<void*> streams_;  // one per stage, created on first use (the device's: it outlives them)
  bool trace_ = false;
  // armed by inject_fault between runs; read by every lane thread of a run, disarmed by the one that fires it
  std::atomic<int> fault_stage_{-1};
  std::string fault_action_;
  std::function<void()> fault_hook_;
  std::vector<StepTiming> timings_;
  size_t keep_ = 0;
  mutable std::mutex rec_mu_;
  std::deque<std::shared_ptr<RunRecord>> runs_;
};

}  // namespace hocc
