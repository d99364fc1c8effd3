#include "transport/inproc.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace hocc {
namespace {

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

class InProcComm final : public Comm {
 public:
  InProcComm(InProcWorld& w, std::string key, int me, int n, std::vector<int> ranks, std::string where)
      : Comm(me, n), w_(w), key_(std::move(key)), ranks_(std::move(ranks)), where_(std::move(where)) {}

  void exchange(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                const Lane& lane) override {
    Device& dev = w_.device();
    const size_t es = dtype_size(t);
    InProcWorld::Msg out{send, send_n * es};
    if (send_n) {
      dev.sync(lane.stream);  // what we post must be written
      std::lock_guard<std::mutex> lk(w_.mutex());
      w_.channel(edge(me, (me + 1) % n)).queue.push_back(&out);
      w_.cond().notify_all();
    }
    try {
      if (recv_n) receive(recv, recv_n, t, op, lane);
      if (send_n) {
        std::unique_lock<std::mutex> lk(w_.mutex());
        w_.wait(lk, [&] { return out.consumed; }, ranks_[me], ranks_[(me + 1) % n],
                [&] { return peer((me + 1) % n, "take our segment"); });
      }
    } catch (...) {
      if (send_n) withdraw(out);
      throw;
    }
  }

 private:
  void receive(char* recv, size_t recv_n, DType t, RedOp op, const Lane& lane) {
    Device& dev = w_.device();
    const size_t es = dtype_size(t);
    InProcWorld::Channel* in;
    InProcWorld::Msg* msg;
    {
      std::unique_lock<std::mutex> lk(w_.mutex());
      in = &w_.channel(edge((me + n - 1) % n, me));
      w_.wait(lk, [&] { return !in->queue.empty(); }, ranks_[me], ranks_[(me + n - 1) % n],
              [&] { return peer((me + n - 1) % n, "send its segment"); });
      msg = in->queue.front();
      if (msg->bytes != recv_n * es)
        throw Error("hocc in-process: ring members disagree on a segment's size (" + std::to_string(msg->bytes) +
                    " vs " + std::to_string(recv_n * es) + " bytes): the ranks ran different plans");
      msg->taken = true;  // from here on its sender waits for us, whatever happens
    }
    dev.reduce(recv, msg->data, recv_n, t, op, lane.stream);
    dev.sync(lane.stream);
    std::lock_guard<std::mutex> lk(w_.mutex());
    in->queue.pop_front();
    msg->consumed = true;
    w_.cond().notify_all();
  }

  // after a failure: never leave a pointer to our stack behind. A receiver that
  // took it is reading it now (and waits on nobody), so let it finish; else withdraw it.
  void withdraw(InProcWorld::Msg& out) {
    std::unique_lock<std::mutex> lk(w_.mutex());
    if (out.taken) {
      w_.cond().wait(lk, [&] { return out.consumed; });
      return;
    }
    auto& q = w_.channel(edge(me, (me + 1) % n)).queue;
    for (auto it = q.begin(); it != q.end(); ++it)
      if (*it == &out) {
        q.erase(it);
        return;
      }
  }

  std::string edge(int from, int to) const { return key_ + ":" + std::to_string(from) + ">" + std::to_string(to); }
  // what a wait is for, naming the silent peer: "rank 3 (member 1 of stage 0 group [2,3]) to send its segment"
  std::string peer(int member, const char* to_do) const {
    return "rank " + std::to_string(ranks_[member]) + " (member " + std::to_string(member) + " of " + where_ +
           ") to " + to_do + ", as rank " + std::to_string(ranks_[me]);
  }
  InProcWorld& w_;
  std::string key_;
  std::vector<int> ranks_;
  std::string where_;
};

}  // namespace

int InProcTransport::size() const { return world_.size(); }
Device& InProcTransport::device() { return world_.device(); }
void InProcTransport::abort(const std::string& why) { world_.abort(why); }

void InProcTransport::prepare(const Plan& plan) {
  world_.enter(rank_);
  for (const Step& s : plan.steps())
    for (const GroupSlice& g : s.groups)
      if (g.ranks.size() > 1 && std::count(g.ranks.begin(), g.ranks.end(), rank_)) comm(s.stage, g.ranks);
}

Comm& InProcTransport::comm(int stage, const std::vector<int>& ranks, Impl) {
  std::lock_guard<std::mutex> lk(mu_);
  auto key = std::make_pair(stage, ranks);
  auto it = comms_.find(key);
  if (it != comms_.end()) return *it->second;
  int me = -1;
  std::string name = "s" + std::to_string(stage) + "[", members = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == rank_) me = int(i);
    name += std::to_string(ranks[i]) + ",";
    members += (i ? "," : "") + std::to_string(ranks[i]);
  }
  members += "]";
  if (me < 0) throw Error("hocc in-process: rank " + std::to_string(rank_) + " is not in group " + members);
  auto c = std::make_unique<InProcComm>(world_, name + "]", me, int(ranks.size()), ranks,
                                        "stage " + std::to_string(stage) + " group " + members);
  c->ranks = ranks;
  Comm& ref = *c;
  comms_.emplace(key, std::move(c));
  return ref;
}

InProcWorld::InProcWorld(int size, Device& device, double timeout_s)
    : device_(device), timeout_s_(timeout_s), waiting_on_(size > 0 ? size : 0), entered_(waiting_on_.size(), 0) {
  if (size < 1) throw Error("hocc in-process: a world needs at least one rank");
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<InProcTransport>(*this, r));
}

InProcWorld::Channel& InProcWorld::channel(const std::string& key) { return channels_[key]; }

template <class Pred, class What>
void InProcWorld::wait(std::unique_lock<std::mutex>& lk, Pred pred, int me, int peer, What what) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  // a rank's lanes may wait at once, each on its own peer; a lane that timed out stays
  // marked, so that peers timing out just after it still see whom it waited on
  auto mark = waiting_on_[me].insert(peer);
  struct Done {
    std::vector<std::multiset<int>>& w;
    int me;
    std::multiset<int>::iterator mark;
    bool timed_out = false;
    ~Done() {
      if (!timed_out) w[me].erase(mark);
    }
  } done{waiting_on_, me, mark};
  while (!pred()) {
    if (!aborted_.empty()) throw Error("hocc in-process: a peer failed (" + aborted_ + ")");
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !pred()) {
      done.timed_out = true;
      throw Error("hocc in-process: timed out after " + seconds(timeout_s_) + " waiting for " + what() + "; " +
                  silent(peer));
    }
  }
}

std::string InProcWorld::silent(int peer) const {
  // breadth-first through who waits on whom, from our peer to the nearest rank that waits on nobody
  const int n = int(waiting_on_.size());
  std::vector<int> from(n, -2);
  std::vector<int> queue{peer};
  from[peer] = -1;
  int quiet = -1;
  for (size_t i = 0; i < queue.size() && quiet < 0; ++i) {
    const int r = queue[i];
    if (waiting_on_[r].empty()) quiet = r;
    for (int next : waiting_on_[r])
      if (from[next] == -2) from[next] = r, queue.push_back(next);
  }
  if (quiet < 0)
    return "ranks wait on each other in a cycle from rank " + std::to_string(peer) +
           ": they are running different collectives or plans";
  std::vector<int> chain;  // peer ... quiet
  for (int r = quiet; r >= 0; r = from[r]) chain.insert(chain.begin(), r);
  std::string s;
  if (chain.size() > 1) {
    s = "rank " + std::to_string(peer) + " itself waits";
    for (size_t i = 1; i < chain.size(); ++i)
      s += (i > 1 ? ", which waits" : "") + std::string(" on rank ") + std::to_string(chain[i]);
    s += "; ";
  }
  // the chain may end at a rank that is only slow to reach its next wait (it has begun this run
  // and waits on nobody yet); a rank that has not begun the run at all is then the likelier culprit
  std::vector<int> absent;
  for (int r = 0; r < n; ++r)
    if (!entered_[r]) absent.push_back(r);
  if (entered_[quiet] && !absent.empty()) {
    std::string others;
    for (size_t i = 1; i < absent.size(); ++i) others += (i > 1 ? ", " : "") + std::to_string(absent[i]);
    return s + "rank " + std::to_string(quiet) + " has begun this call and waits on nobody (it is still working); " +
           "rank " + std::to_string(absent[0]) + " never answered" +
           (others.empty() ? "" : " (nor did ranks " + others + ")") +
           ": it has not begun this call: it is dead, stopped, or did not make it";
  }
  return s + "rank " + std::to_string(quiet) + " never answered: it is dead, stopped, or did not make this call";
}

void InProcWorld::abort(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_.empty()) aborted_ = why;
  cv_.notify_all();
}

void InProcWorld::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_.clear();
  channels_.clear();
  for (auto& w : waiting_on_) w.clear();
  std::fill(entered_.begin(), entered_.end(), 0);
}

void InProcWorld::enter(int rank) {
  std::lock_guard<std::mutex> lk(mu_);
  entered_.at(rank) = 1;
}

}  // namespace hocc
