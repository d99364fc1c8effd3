// NCCL transport: one communicator over the whole group (unique id exchanged
// through the torch.distributed store by the Python side), split once per
// (stage, partition into groups) with ncclCommSplit. Native steps are NCCL's
// collectives in place; ring steps are ncclSend/ncclRecv pairs (grouped, so a
// ring never deadlocks) with the receive reduced by our own kernels. Every op
// is enqueued on the lane's stream: the executor runs it asynchronously.
//
// No call can hang forever (the watchdog, nccl_watchdog.h): communicators are
// nonblocking (config.blocking = 0), so init, split and every enqueue are
// polled against the group's timeout; each run is watched until its last
// event completes. On a timeout or an async NCCL error every communicator of
// the transport is aborted (the kernels waiting on a dead peer exit), and
// every later call raises at once: the group must be destroyed and made again.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "device/cuda_device.h"
#include "transport/nccl_watchdog.h"
#include "transport/transport.h"

namespace hocc {

class NcclTransport final : public Transport {
 public:
  static std::string unique_id();  // ncclUniqueId as bytes (rank 0 makes it, the store spreads it)
  // timeout_s bounds init, every split, every enqueue and every run (the group's
  // timeout); name says which group in errors; on_error: what the watchdog does
  NcclTransport(const std::string& id, int rank, int size, int device, double timeout_s = 600.0,
                const std::string& name = "", OnError on_error = OnError::abort);
  ~NcclTransport() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device& device() override { return device_; }
  bool async() const override { return true; }
  void prepare(const Plan& plan) override;
  Comm& comm(int stage, const std::vector<int>& ranks, Impl impl = Impl::native) override;
  void abort(const std::string& why) override;
  // the whole group, for a world-of-one check and for native calls
  Comm& world();

  // One run, around Executor::run: begin() raises at once on an aborted
  // transport or a stream being captured into a CUDA graph, and starts the
  // run's host deadline; end() hands the run (an event on the caller's stream)
  // to the watchdog (enqueued false: the run raised). what: the collective, for errors.
  void begin(void* caller_stream, const std::string& what);
  void end(void* caller_stream, bool enqueued);
  // host wait for every run handed over so far (blocking wait): raises on
  // timeout or error, after aborting
  void wait();
  // the reason the transport was aborted ("" while it works)
  std::string error() const { return watchdog_->error(); }
  double timeout_s() const { return timeout_s_; }

 private:
  void* split(void* parent, int color, int key, const std::string& what);  // a nonblocking ncclCommSplit
  const int rank_, size_;
  const double timeout_s_;
  const std::string name_;
  CudaDevice device_;
  void* parent_ = nullptr;  // ncclComm_t
  std::unique_ptr<NcclWatchdog> watchdog_;
  std::unique_ptr<Comm> world_;
  std::set<std::pair<int, std::vector<std::vector<int>>>> splits_;  // partitions already split
  std::map<std::pair<int, std::vector<int>>, std::unique_ptr<Comm>> comms_;
};

std::string nccl_version();

}  // namespace hocc
