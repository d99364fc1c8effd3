// NCCL transport: one communicator over the whole group (unique id exchanged
// through the torch.distributed store by the Python side), split once per
// (stage, partition into groups) with ncclCommSplit. Native steps are NCCL's
// collectives in place; ring steps are ncclSend/ncclRecv pairs (grouped, so a
// ring never deadlocks) with the receive reduced by our own kernels. Every op
// is enqueued on the lane's stream: the executor runs it asynchronously.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "device/cuda_device.h"
#include "transport/transport.h"

namespace hocc {

class NcclTransport final : public Transport {
 public:
  static std::string unique_id();  // ncclUniqueId as bytes (rank 0 makes it, the store spreads it)
  NcclTransport(const std::string& id, int rank, int size, int device);
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

 private:
  const int rank_, size_;
  CudaDevice device_;
  void* parent_ = nullptr;  // ncclComm_t
  std::unique_ptr<Comm> world_;
  std::set<std::pair<int, std::vector<std::vector<int>>>> splits_;  // partitions already split
  std::map<std::pair<int, std::vector<int>>, std::unique_ptr<Comm>> comms_;
};

std::string nccl_version();

}  // namespace hocc
