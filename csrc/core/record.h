// What this rank did in one run, as it ran (hocc's flight recorder; the
// Python side, hocc/record/, keeps the last N calls and writes them out).
//   a step: this rank's part of one group of one plan step, by index
//     (plan.steps[step].groups[group]), and when the rank began and ended it;
//   an exchange: one ring step inside it (transport/ring.cc): when it was
//     posted, when its receive ended and when it ended (its send too), the
//     bytes each way, and the successor and predecessor (ranks of the
//     engine's group).
// Times are wall-clock nanoseconds (CLOCK_REALTIME), so that ranks' records
// merge into one timeline where the hosts' clocks are synchronized.
// Lanes append concurrently and a dump may read a run still in flight, so
// every access takes the record's lock (uncontended: a few lanes per run).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

namespace hocc {

inline int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct StepRecord {
  int32_t step, group;      // plan.steps[step].groups[group]
  int64_t begin_ns, end_ns;  // end 0: not ended (still running, or failed)
};

struct ExchangeRecord {
  int32_t step;               // index into RunRecord::steps
  int32_t to, from;           // the ring successor and predecessor (-1: unknown)
  int64_t post_ns;
  int64_t done_ns;            // the receive ended (the link's transfer is timed by it)
  int64_t end_ns;             // the whole exchange ended (the send too)
  int64_t sent, received;     // bytes
};

class RunRecord {
 public:
  explicit RunRecord(int64_t seq = -1) : seq_(seq), begin_ns_(wall_ns()) {}
  int64_t seq() const { return seq_; }  // the engine's call number (-1: not given)
  int32_t begin_step(int32_t step, int32_t group) {
    const int64_t now = wall_ns();
    std::lock_guard<std::mutex> lk(mu_);
    steps_.push_back({step, group, now, 0});
    return int32_t(steps_.size() - 1);
  }
  void end_step(int32_t i) {
    const int64_t now = wall_ns();
    std::lock_guard<std::mutex> lk(mu_);
    steps_[size_t(i)].end_ns = now;
  }
  void exchange(const ExchangeRecord& x) {
    std::lock_guard<std::mutex> lk(mu_);
    exchanges_.push_back(x);
  }
  void end() {
    const int64_t now = wall_ns();
    std::lock_guard<std::mutex> lk(mu_);
    end_ns_ = now;
  }
  // copies, safe while the run goes on
  std::vector<StepRecord> steps() const {
    std::lock_guard<std::mutex> lk(mu_);
    return steps_;
  }
  std::vector<ExchangeRecord> exchanges() const {
    std::lock_guard<std::mutex> lk(mu_);
    return exchanges_;
  }
  int64_t begin_ns() const { return begin_ns_; }
  int64_t end_ns() const {
    std::lock_guard<std::mutex> lk(mu_);
    return end_ns_;
  }

 private:
  mutable std::mutex mu_;
  const int64_t seq_;
  const int64_t begin_ns_;
  int64_t end_ns_ = 0;
  std::vector<StepRecord> steps_;
  std::vector<ExchangeRecord> exchanges_;
};

}  // namespace hocc
