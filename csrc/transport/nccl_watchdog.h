// The NCCL transport's watchdog: no hocc NCCL call hangs forever.
//
// hocc's communicators sit outside torch's ProcessGroupNCCL, so its watchdog
// never sees them; this one does the same job for one NcclTransport:
//   - it owns the transport's communicators (nonblocking: config.blocking = 0)
//     and serialises every NCCL call with abort (NCCL calls on one
//     communicator must not overlap ncclCommAbort from another thread);
//   - every enqueue that returns ncclInProgress is polled to completion
//     against the deadline (the group's timeout);
//   - each run is a record: the host call's deadline while it is in the
//     executor, then an event after each NCCL op (to name the step that did
//     not finish) and one after the whole run on the caller's stream;
//   - a thread polls the oldest run's event and every communicator's
//     ncclCommGetAsyncError; on a deadline passed or an async error it aborts
//     every communicator (the kernels that wait on a dead peer exit, so the
//     caller's stream drains) and keeps the reason; every later call raises it.
// What happens on an error follows TORCH_NCCL_ASYNC_ERROR_HANDLING's modes
// (OnError); hocc's default differs from torch's (which tears the process
// down): it aborts the communicators and lets the caller catch the error and
// re-initialise the group.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hocc {

// TORCH_NCCL_ASYNC_ERROR_HANDLING's values: 0 none (record the error only),
// 1 abort the communicators and end the process, 2 abort only (hocc's
// default), 3 end the process without aborting
enum class OnError { none = 0, teardown_abort = 1, abort = 2, teardown = 3 };

class NcclWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  NcclWatchdog(int device, double timeout_s, std::string name, OnError on_error);
  ~NcclWatchdog();  // stops the thread, then finalizes (or aborts) every communicator
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  Clock::time_point deadline() const;  // now + the timeout
  // a fresh communicator (ncclComm_t): waits out its nonblocking init (init or
  // split) until `until`, then watches it; on failure aborts it and throws
  void adopt(void* comm, const std::string& what, Clock::time_point until);
  // one NCCL call (result) on `comm` while the caller holds lock(): raises on
  // an error, waits out ncclInProgress, then records a step event on `stream`
  std::unique_lock<std::mutex> lock();  // throws if the transport was aborted
  void settle(std::unique_lock<std::mutex>& lk, void* comm, int result, const std::string& label, void* stream);
  // finalize and destroy one adopted communicator now (a duplicate split)
  void release(void* comm);

  void begin(void* caller_stream, const std::string& what);  // a run starts (raises if aborted or capturing)
  // the run is enqueued: watch it; or it raised (enqueued false): if it had enqueued any
  // NCCL op the peers wait on this rank in vain, so the transport is aborted
  void end(void* caller_stream, bool enqueued);
  void wait();                                               // host wait for every run (blocking wait)
  void fail(const std::string& why);                         // abort everything (once)
  std::string error() const;

 private:
  struct Step {
    void* event;
    std::string label;
  };
  struct Run {
    std::string what;
    Clock::time_point deadline;
    std::vector<Step> steps;
    void* done = nullptr;  // event after the run, on the caller's stream
  };
  void main();
  void poll(std::unique_lock<std::mutex>& lk);  // one round of checks, lock held
  void fail_locked(const std::string& why);
  void close(void* comm, bool graceful, Clock::time_point until);  // finalize + destroy, or abort
  void* event();
  void recycle(Run& r);
  std::string describe(const Run& r) const;
  std::string hint() const;
  [[noreturn]] void raise_locked() const;

  const int device_;
  const double timeout_s_;
  const std::string name_;
  const OnError on_error_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string error_;
  bool aborted_ = false;           // the communicators were aborted (nothing left to destroy)
  std::vector<void*> comms_;       // adopted, in creation order
  std::deque<Run> runs_;           // handed over, oldest first
  bool in_call_ = false;           // a run is in the executor now
  Run current_;
  std::vector<void*> free_events_;
  std::thread thread_;
};

}  // namespace hocc
