// One engine's queue of calls: a single worker thread runs them in the order
// they were pushed (every rank pushes the same calls in the same order, which
// keeps sub-group traffic matched). Why in C++: an async call queued to a
// Python thread paid a thread handoff under the GIL on every call (about
// 100 us on one rank, where the call itself is 25 us); here a plan run goes
// from push to the executor without Python, and a caller waits for its ticket
// with the GIL released.
//
// Items are plain functions of their ticket; the bindings make them (a plan
// run, with or without Python around it), and they catch their own errors. Every call of an engine is an item, sync or async: run_here()
// runs a sync call's item on the caller's own thread when nothing is queued or
// running (no hand-off; it takes a ticket, keeps the order and shows in
// busy_for like any other), else the caller pushes it. Tickets number the items from 0; item t
// is done once completed() > t. cancel() drops the items not begun: their
// waits return kDropped, and the worker stops after the item it runs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace hocc {

class CallQueue {
 public:
  using Job = std::function<void(uint64_t ticket)>;
  enum Wait { kDone = 0, kDropped = 1, kTimedOut = 2 };

  // on_done(completed): called on the worker after an item that watch() asked for (see watch)
  explicit CallQueue(std::function<void(uint64_t)> on_done = nullptr);
  ~CallQueue();  // drops what is queued, joins the worker
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;

  // The next ticket; the job runs after every earlier one. Throws once closed or cancelled.
  uint64_t push(Job job);
  // A sync call's item, run on this thread now if the queue is idle: true once it ran (an exception
  // it throws passes through, the item counted done); false, and nothing done, if not or if the
  // queue has stopped (push it: push says why).
  bool run_here(const Job& job);
  // A waiter's item, run on its own thread if it is next and the worker has not begun it (a sync
  // caller of an async API, e.g. torch's all_reduce on a backend: no hand-off to the worker and back).
  // The item handles its own errors, as on the worker. True once it ran; false, nothing done, if not
  // (begun, not next, dropped, or the queue is stopping: wait for it).
  bool run_queued_here(uint64_t ticket);
  // Blocks until item `ticket` is done or dropped, or timeout_s (< 0: no limit) has passed.
  Wait wait(uint64_t ticket, double timeout_s = -1);
  uint64_t completed() const { return s_->completed.load(std::memory_order_acquire); }
  uint64_t pushed() const;
  bool idle() const { return completed() == pushed(); }
  bool dropped(uint64_t ticket) const;
  // Ask for on_done once item `ticket` is done; false if it already is (the caller acts itself)
  bool watch(uint64_t ticket);
  // seconds the running item has run (0: none runs): the watchdog's "a call is in flight"
  double busy_for() const;
  // on the worker thread, while it runs (a thread id is reused once its thread has ended)
  bool on_worker() const { return !s_->ended.load(std::memory_order_acquire) && std::this_thread::get_id() == worker_id_; }
  // Run what is queued, then stop the worker and join it (from the worker itself: no join)
  void close();
  // Drop what is not begun (their tickets: [first, pushed)), stop after the running item; returns first.
  // Does not join (the caller may be the worker): join() does.
  uint64_t cancel(const std::string& why);
  // Waits for the worker to stop and for an item run_here() runs to end; any number of threads at
  // once; returns at once on the worker itself
  void join();
  std::string why_stopped() const;

 private:
  // What the worker touches, shared with it: a queue destroyed on its own worker (the last
  // reference to its owner dropped by an item) lets the worker finish that item and end alone.
  struct State {
    std::mutex mu;
    std::condition_variable work_cv, done_cv;
    std::deque<Job> jobs;
    uint64_t pushed = 0;                       // tickets handed out
    std::atomic<uint64_t> completed{0};        // items done
    uint64_t dropped_from = UINT64_MAX;        // the first dropped ticket
    uint64_t watch = UINT64_MAX;               // the lowest ticket someone waits to hear of
    std::atomic<int64_t> running_since_ns{0};  // steady clock; 0: idle
    bool here = false;                         // an item runs on its caller's thread (run_here)
    bool stopping = false;                     // close(): stop once empty; cancel(): at once
    bool orphaned = false;                     // the queue is gone: tell nobody anything
    std::atomic<bool> ended{false};            // the worker left its loop
    std::string why;
    std::function<void(uint64_t)> on_done;
  };
  static void loop(std::shared_ptr<State> s);
  static void finish(State& s);  // the running item ended: count it done, tell waiters and on_done

  std::shared_ptr<State> s_;
  std::mutex join_mu_;  // std::thread::join from two threads at once is undefined
  std::thread worker_;
  std::thread::id worker_id_;
};

}  // namespace hocc
