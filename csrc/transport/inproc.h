// In-process transport: every rank is a thread of one process and data moves
// through memory, so the very same executor runs in CI on the CPU, and with
// all ranks on one GPU (one stream per lane) where only one GPU is at hand.
//
// An exchange is a rendezvous: the sender posts a pointer to its segment on
// the (comm, sender -> receiver) channel; the receiver reduces or copies
// straight from it, then marks it consumed; the sender returns once its
// segment was consumed (it may be overwritten next). Messages on a channel
// match in order, as each comm is used by one lane of each member.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace hocc {

class InProcWorld;

class InProcTransport final : public Transport {
 public:
  InProcTransport(InProcWorld& world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override;
  Device& device() override;
  bool async() const override { return false; }
  void prepare(const Plan& plan) override;
  Comm& comm(int stage, const std::vector<int>& ranks, Impl impl = Impl::ring) override;
  void abort(const std::string& why) override;

 private:
  InProcWorld& world_;
  const int rank_;
  std::mutex mu_;
  std::map<std::pair<int, std::vector<int>>, std::unique_ptr<Comm>> comms_;
};

// What all ranks of one in-process world share: the channels.
class InProcWorld {
 public:
  // `device` is shared by all ranks (CPU, or the one GPU); timeout bounds every wait
  InProcWorld(int size, Device& device, double timeout_s);
  int size() const { return int(ranks_.size()); }
  Device& device() { return device_; }
  InProcTransport& rank(int r) { return *ranks_.at(r); }

  struct Msg {
    const char* data;
    size_t bytes;
    bool taken = false;     // a receiver is reading it
    bool consumed = false;  // done: the sender may reuse its buffer
  };
  struct Channel {
    std::deque<Msg*> queue;
  };
  Channel& channel(const std::string& key);
  // rank `me` blocks on the world's condition until pred() or abort/timeout, waiting on rank
  // `peer`; a timeout throws, saying what() it waited for (built only then) and which rank
  // never answered (following who waits on whom)
  template <class Pred, class What>
  void wait(std::unique_lock<std::mutex>& lk, Pred pred, int me, int peer, What what);
  std::mutex& mutex() { return mu_; }
  std::condition_variable& cond() { return cv_; }
  void abort(const std::string& why);
  void reset();  // clear an abort, for the next run
  void enter(int rank);  // `rank` has begun this run

 private:
  Device& device_;
  double timeout_s_;
  std::vector<std::unique_ptr<InProcTransport>> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Channel> channels_;
  std::string aborted_;
  std::vector<std::multiset<int>> waiting_on_;  // [rank] -> the ranks its lanes wait on now
  std::vector<char> entered_;  // [rank] -> it has begun this run (a rank that has not is the likelier culprit)
  std::string silent(int peer) const;
};

}  // namespace hocc
