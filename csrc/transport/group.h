// The transport of one rank of a multi-process group, on any device: the
// Python side sets up each communicator a plan needs (shared memory for 'shm'
// steps on CPU, a c10d backend for 'native' and 'ring' ones: gloo on CPU, NCCL
// on GPUs) in one global order and registers it here by (stage, members,
// impl); the executor then runs without Python. On a GPU the transport is
// async: comm ops enqueue on the lanes' streams and the host never waits.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "transport/transport.h"

namespace hocc {

class GroupTransport final : public Transport {
 public:
  GroupTransport(int rank, int size, std::unique_ptr<Device> device);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device& device() override { return *device_; }
  bool async() const override { return device_->is_cuda(); }
  // checks that every communicator the plan needs here was registered
  void prepare(const Plan& plan) override;
  Comm& comm(int stage, const std::vector<int>& ranks, Impl impl) override;
  void begin(const CallId& call) override;
  void abort(const std::string& why) override;

  void add(int stage, const std::vector<int>& ranks, Impl impl, std::shared_ptr<Comm> comm);
  bool has(int stage, const std::vector<int>& ranks, Impl impl) const;
  void clear();  // drop every communicator (closing the engine)
  size_t held_bytes() const;  // what the communicators hold between calls (Comm::held_bytes)

 private:
  const int rank_, size_;
  std::unique_ptr<Device> device_;
  mutable std::mutex mu_;
  using Key = std::tuple<int, std::vector<int>, Impl>;
  std::map<Key, std::shared_ptr<Comm>> comms_;
  CallId call_;  // the running call, which every comm points at
};

}  // namespace hocc
