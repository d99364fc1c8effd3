#include "executor/call_queue.h"

#include <cxxabi.h>

#include <chrono>

#include "core/types.h"

namespace hocc {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

CallQueue::CallQueue(std::function<void(uint64_t)> on_done) : s_(std::make_shared<State>()) {
  s_->on_done = std::move(on_done);
  worker_ = std::thread(&CallQueue::loop, s_);
  worker_id_ = worker_.get_id();
}

CallQueue::~CallQueue() {
  cancel("the queue was destroyed");
  if (!on_worker()) {
    join();
    return;
  }
  {  // destroyed by its own item: the worker ends that item, then stops, telling no one
    std::lock_guard<std::mutex> lk(s_->mu);
    s_->orphaned = true;
  }
  std::lock_guard<std::mutex> lk(join_mu_);
  if (worker_.joinable()) worker_.detach();
}

uint64_t CallQueue::push(Job job) {
  std::lock_guard<std::mutex> lk(s_->mu);
  if (s_->stopping) throw Error("hocc: this engine's call queue is " + s_->why);
  s_->jobs.push_back(std::move(job));
  s_->work_cv.notify_one();
  return s_->pushed++;
}

bool CallQueue::run_here(const Job& job) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    // queued or running, or stopped (push then says why): not here
    if (s_->stopping || s_->completed.load(std::memory_order_relaxed) != s_->pushed) return false;
    ticket = s_->pushed++;
    s_->here = true;  // the worker starts nothing until this item ends
    s_->running_since_ns.store(steady_ns(), std::memory_order_relaxed);
  }
  struct Finish {  // however the item is left
    State& s;
    ~Finish() { finish(s); }
  } finish_here{*s_};
  job(ticket);
  return true;
}

bool CallQueue::run_queued_here(uint64_t ticket) {
  Job job;
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    const uint64_t next = s_->pushed - s_->jobs.size();  // the first ticket not begun
    if (s_->stopping || s_->here || s_->jobs.empty() || next != ticket ||
        s_->completed.load(std::memory_order_relaxed) != ticket)  // an earlier item still runs
      return false;
    job = std::move(s_->jobs.front());
    s_->jobs.pop_front();
    s_->here = true;  // as run_here: the worker starts nothing until this item ends
    s_->running_since_ns.store(steady_ns(), std::memory_order_relaxed);
  }
  struct Finish {
    State& s;
    ~Finish() { finish(s); }
  } finish_here{*s_};
  try {
    job(ticket);
  } catch (...) {  // as on the worker: the bindings' jobs catch their own errors
  }
  return true;
}

void CallQueue::finish(State& s) {
  bool tell;
  uint64_t done;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    const bool here = s.here;
    s.here = false;
    s.running_since_ns.store(0, std::memory_order_relaxed);
    done = s.completed.load(std::memory_order_relaxed) + 1;
    s.completed.store(done, std::memory_order_release);
    tell = s.watch < done && !s.orphaned;
    if (tell) s.watch = UINT64_MAX;
    s.done_cv.notify_all();
    // the worker waits for an item run here to end only when one is queued behind it; waking it
    // otherwise costs a sync call a thread switch (on a busy core, the peer rank's time)
    if (here && !s.jobs.empty()) s.work_cv.notify_one();
  }
  if (tell && s.on_done) s.on_done(done);
}

uint64_t CallQueue::pushed() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  return s_->pushed;
}

bool CallQueue::dropped(uint64_t ticket) const {
  std::lock_guard<std::mutex> lk(s_->mu);
  return ticket >= s_->dropped_from && ticket < s_->pushed;
}

std::string CallQueue::why_stopped() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  return s_->why;
}

CallQueue::Wait CallQueue::wait(uint64_t ticket, double timeout_s) {
  std::unique_lock<std::mutex> lk(s_->mu);
  auto ready = [&] { return completed() > ticket || ticket >= s_->dropped_from; };
  if (timeout_s < 0) {
    s_->done_cv.wait(lk, ready);
  } else if (!s_->done_cv.wait_for(lk, std::chrono::duration<double>(timeout_s), ready)) {
    return kTimedOut;
  }
  return completed() > ticket ? kDone : kDropped;
}

bool CallQueue::watch(uint64_t ticket) {
  std::lock_guard<std::mutex> lk(s_->mu);
  if (completed() > ticket || ticket >= s_->dropped_from) return false;
  if (ticket < s_->watch) s_->watch = ticket;
  return true;
}

double CallQueue::busy_for() const {
  const int64_t since = s_->running_since_ns.load(std::memory_order_relaxed);
  return since == 0 ? 0.0 : double(steady_ns() - since) * 1e-9;
}

void CallQueue::close() {
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    if (!s_->stopping) s_->why = "closed";
    s_->stopping = true;
    s_->work_cv.notify_one();
  }
  join();
}

uint64_t CallQueue::cancel(const std::string& why) {
  std::deque<Job> dropped;  // freed after the lock: a job holding Python objects takes the GIL to let go of them
  uint64_t first;
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    first = s_->pushed - s_->jobs.size();
    if (!s_->jobs.empty() && first < s_->dropped_from) s_->dropped_from = first;
    dropped.swap(s_->jobs);
    if (s_->why.empty() || s_->why == "closed") s_->why = why;
    s_->stopping = true;
    s_->work_cv.notify_one();
    s_->done_cv.notify_all();
  }
  return first;
}

void CallQueue::join() {
  if (on_worker()) return;  // the worker cannot wait for itself
  {
    std::lock_guard<std::mutex> lk(join_mu_);  // a second caller waits here for the first one's join
    if (worker_.joinable()) worker_.join();
  }
  std::unique_lock<std::mutex> lk(s_->mu);  // an item run on its caller's thread ends too
  s_->done_cv.wait(lk, [&] { return !s_->here; });
}

void CallQueue::loop(std::shared_ptr<State> s) {
  struct Ended {  // however the loop is left (a forced unwind at interpreter exit included)
    State& s;
    ~Ended() { s.ended.store(true, std::memory_order_release); }
  } ended{*s};
  for (;;) {
    Job job;
    uint64_t ticket;
    {
      std::unique_lock<std::mutex> lk(s->mu);
      s->work_cv.wait(lk, [&] { return (!s->jobs.empty() && !s->here) || (s->stopping && s->jobs.empty()); });
      if (s->jobs.empty()) return;  // stopping, and nothing left to run
      job = std::move(s->jobs.front());
      s->jobs.pop_front();
      ticket = s->completed.load(std::memory_order_relaxed);  // items run in ticket order
      s->running_since_ns.store(steady_ns(), std::memory_order_relaxed);
    }
    try {
      job(ticket);
    } catch (abi::__forced_unwind&) {  // the thread is being ended (pthread_exit): let it go
      throw;
    } catch (...) {  // the bindings' jobs catch their own errors; this only keeps the worker alive
    }
    job = nullptr;
    finish(*s);
  }
}

}  // namespace hocc
