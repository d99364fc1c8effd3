#include "transport/nccl_watchdog.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/types.h"

namespace hocc {
namespace {

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

std::string nccl_error(ncclResult_t r) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) s += " (" + std::string(last) + ")";
  return s;
}

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

// the communicator's state: ncclSuccess, ncclInProgress, or its error
ncclResult_t state(void* comm) {
  ncclResult_t st = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(as_comm(comm), &st);
  return r != ncclSuccess ? r : st;
}

constexpr auto kPollPeriod = std::chrono::milliseconds(20);  // the watchdog thread's round
constexpr auto kSpin = std::chrono::microseconds(200);       // a caller waiting out ncclInProgress
constexpr double kTeardownCap = 30.0;                        // longest wait for a graceful finalize

}  // namespace

NcclWatchdog::NcclWatchdog(int device, double timeout_s, std::string name, OnError on_error)
    : device_(device), timeout_s_(timeout_s > 0 ? timeout_s : 600.0), name_(std::move(name)), on_error_(on_error) {
  thread_ = std::thread([this] { main(); });
}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::unique_lock<std::mutex> lk(mu_);
  cudaSetDevice(device_);
  // let what was enqueued drain (bounded), then finalize; whatever does not end in time is aborted
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(std::min(timeout_s_, kTeardownCap)));
  while (!aborted_ && !runs_.empty() && Clock::now() < until) {
    if (cudaEventQuery(as_event(runs_.front().done)) == cudaErrorNotReady) {
      std::this_thread::sleep_for(kSpin);
      continue;
    }
    recycle(runs_.front());
    runs_.pop_front();
  }
  if (!aborted_) {
    const bool drained = runs_.empty();
    for (auto it = comms_.rbegin(); it != comms_.rend(); ++it)  // sub-communicators before the parent
      close(*it, drained, until);
  }
  comms_.clear();
  for (Run& r : runs_) recycle(r);
  if (in_call_) recycle(current_);
  for (void* e : free_events_) cudaEventDestroy(as_event(e));
}

NcclWatchdog::Clock::time_point NcclWatchdog::deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
}

std::string NcclWatchdog::hint() const {
  return "the group's NCCL communicators are aborted and it cannot run collectives any more: destroy the process "
         "group (torch.distributed.destroy_process_group(), and hocc.reset_engines() for hocc's calls on it) and "
         "init it again";
}

void NcclWatchdog::raise_locked() const { throw Error(error_ + "; " + hint()); }

std::string NcclWatchdog::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

std::unique_lock<std::mutex> NcclWatchdog::lock() {
  std::unique_lock<std::mutex> lk(mu_);
  if (!error_.empty()) raise_locked();
  return lk;
}

void NcclWatchdog::adopt(void* comm, const std::string& what, Clock::time_point until) {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    ncclResult_t st = state(comm);
    if (st == ncclSuccess) break;
    if (st != ncclInProgress || Clock::now() > until || !error_.empty()) {
      ncclCommAbort(as_comm(comm));
      if (!error_.empty()) raise_locked();
      throw Error("hocc nccl (" + name_ + "): " + what +
                  (st != ncclInProgress ? " failed: " + nccl_error(st)
                                        : " did not complete within " + secs(timeout_s_) +
                                              ": a rank of the group did not join it (dead, stopped, or busy in "
                                              "another collective)"));
    }
    lk.unlock();
    std::this_thread::sleep_for(kSpin);
    lk.lock();
  }
  comms_.push_back(comm);
}

void NcclWatchdog::settle(std::unique_lock<std::mutex>& lk, void* comm, int result, const std::string& label,
                          void* stream) {
  auto r = static_cast<ncclResult_t>(result);
  if (r == ncclInProgress) {  // nonblocking: NCCL finishes the enqueue in the background
    const auto until = deadline();
    while ((r = state(comm)) == ncclInProgress) {
      if (Clock::now() > until) {
        fail_locked(label + " was not enqueued within " + secs(timeout_s_) +
                    " (a peer it connects to did not make the same call)");
        raise_locked();
      }
      lk.unlock();  // the watchdog may abort meanwhile: NCCL allows abort while an op is in progress
      std::this_thread::sleep_for(kSpin);
      lk.lock();
      if (!error_.empty()) raise_locked();
    }
  }
  if (r != ncclSuccess) {
    fail_locked(label + " failed: " + nccl_error(r));
    raise_locked();
  }
  if (in_call_ && stream) {
    void* e = event();
    if (cudaEventRecord(as_event(e), as_stream(stream)) != cudaSuccess) {
      free_events_.push_back(e);
      throw Error("hocc nccl (" + name_ + "): cudaEventRecord after " + label + ": " +
                  cudaGetErrorString(cudaGetLastError()));
    }
    current_.steps.push_back({e, label});
  }
}

void NcclWatchdog::release(void* comm) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = std::find(comms_.begin(), comms_.end(), comm);
  if (it == comms_.end() || aborted_) return;
  comms_.erase(it);
  close(comm, true, deadline());
}

void NcclWatchdog::close(void* comm, bool graceful, Clock::time_point until) {
  // nonblocking: ncclCommFinalize starts the flush (ncclInProgress), the state says when it is
  // done, then ncclCommDestroy frees locally; whatever does not end in time is aborted
  bool done = false;
  ncclResult_t fin = graceful ? ncclCommFinalize(as_comm(comm)) : ncclInternalError;
  if (fin == ncclSuccess || fin == ncclInProgress) {
    ncclResult_t st;
    while ((st = state(comm)) == ncclInProgress && Clock::now() < until) std::this_thread::sleep_for(kSpin);
    done = st == ncclSuccess;
  }
  if (done)
    ncclCommDestroy(as_comm(comm));
  else
    ncclCommAbort(as_comm(comm));
}

void NcclWatchdog::begin(void* caller_stream, const std::string& what) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!error_.empty()) raise_locked();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(as_stream(caller_stream), &capture) != cudaSuccess) cudaGetLastError();
  if (capture != cudaStreamCaptureStatusNone)
    throw Error("hocc nccl (" + name_ + "): " + what +
                " was called on a stream that is being captured into a CUDA graph, which hocc does not support "
                "(it watches every run with host-polled events and may create communicators on a first call); "
                "run hocc collectives outside torch.cuda.graph(), or capture torch.distributed's own NCCL "
                "collectives instead");
  if (in_call_) recycle(current_);  // an earlier run that never reached end()
  current_ = Run{what, deadline(), {}, nullptr};
  in_call_ = true;
}

void NcclWatchdog::end(void* caller_stream, bool enqueued) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!in_call_) return;
  in_call_ = false;
  if (!enqueued) {
    // the run raised: if it enqueued any NCCL op, the peers now wait for ops this rank will not
    // make (and this rank's stream may wait on theirs), so nobody may go on
    if (!current_.steps.empty() && error_.empty())
      fail_locked(current_.what + " failed part way, after " + current_.steps.back().label);
    for (Step& s : current_.steps) cudaEventDestroy(as_event(s.event));
    current_ = Run{};
    return;
  }
  if (!error_.empty()) {
    for (Step& s : current_.steps) cudaEventDestroy(as_event(s.event));
    current_ = Run{};
    raise_locked();
  }
  current_.done = event();
  if (cudaEventRecord(as_event(current_.done), as_stream(caller_stream)) != cudaSuccess) {
    std::string why = cudaGetErrorString(cudaGetLastError());
    fail_locked("cudaEventRecord after " + current_.what + ": " + why);
    raise_locked();
  }
  runs_.push_back(std::move(current_));
  current_ = Run{};
}

void NcclWatchdog::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (!error_.empty()) raise_locked();
    poll(lk);
    if (!error_.empty()) raise_locked();
    if (runs_.empty()) return;
    lk.unlock();
    std::this_thread::sleep_for(kSpin);
    lk.lock();
  }
}

void NcclWatchdog::fail(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_locked(why);
}

void NcclWatchdog::main() {
  cudaSetDevice(device_);
  // our event queries must never invalidate a graph being captured by another thread
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, kPollPeriod);
    if (!stop_ && error_.empty()) poll(lk);
  }
}

void NcclWatchdog::poll(std::unique_lock<std::mutex>&) {
  const auto now = Clock::now();
  if (in_call_ && now > current_.deadline)
    return fail_locked(describe(current_) + ": the host call did not return within " + secs(timeout_s_));
  for (void* c : comms_) {
    ncclResult_t st = state(c);
    if (st != ncclSuccess && st != ncclInProgress)
      return fail_locked("NCCL reported an asynchronous error: " + nccl_error(st) +
                         (runs_.empty() ? std::string() : " during " + describe(runs_.front())));
  }
  while (!runs_.empty()) {
    Run& r = runs_.front();
    cudaError_t q = cudaEventQuery(as_event(r.done));
    if (q == cudaSuccess) {
      recycle(r);
      runs_.pop_front();
      continue;
    }
    if (q != cudaErrorNotReady) {
      cudaGetLastError();
      return fail_locked("CUDA error while waiting for " + r.what + ": " + cudaGetErrorString(q));
    }
    if (now > r.deadline) return fail_locked(describe(r) + " did not finish within " + secs(timeout_s_));
    break;  // younger runs have later deadlines
  }
}

std::string NcclWatchdog::describe(const Run& r) const {
  std::string s = r.what;
  for (const Step& st : r.steps)
    if (cudaEventQuery(as_event(st.event)) == cudaErrorNotReady) {
      s += " (the first unfinished step: " + st.label +
           "; a member of that group is dead, stopped, or did not make this call)";
      break;
    }
  return s;
}

void NcclWatchdog::fail_locked(const std::string& why) {
  if (!error_.empty()) return;
  error_ = "hocc nccl (" + name_ + "): " + why;
  const bool abort_comms = on_error_ == OnError::abort || on_error_ == OnError::teardown_abort;
  std::fprintf(stderr, "%s; %s\n", error_.c_str(),
               abort_comms ? "aborting the group's NCCL communicators" : "leaving the communicators as they are");
  if (abort_comms && !aborted_) {
    for (void* c : comms_) ncclCommAbort(as_comm(c));
    comms_.clear();
    aborted_ = true;
    // the runs' events may still be pending: destroying them is safe, reusing them is not
    for (Run& r : runs_) {
      for (Step& s : r.steps) cudaEventDestroy(as_event(s.event));
      if (r.done) cudaEventDestroy(as_event(r.done));
    }
    runs_.clear();
  }
  if (on_error_ == OnError::teardown || on_error_ == OnError::teardown_abort) {
    std::fprintf(stderr, "hocc nccl: ending the process (TORCH_NCCL_ASYNC_ERROR_HANDLING=%d)\n", int(on_error_));
    std::fflush(stderr);
    std::abort();
  }
}

void* NcclWatchdog::event() {
  if (!free_events_.empty()) {
    void* e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaSetDevice(device_);
  cudaEvent_t e;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
    throw Error("hocc nccl (" + name_ + "): cudaEventCreate: " + cudaGetErrorString(cudaGetLastError()));
  return e;
}

void NcclWatchdog::recycle(Run& r) {
  for (Step& s : r.steps) free_events_.push_back(s.event);
  if (r.done) free_events_.push_back(r.done);
  r.steps.clear();
  r.done = nullptr;
}

}  // namespace hocc
