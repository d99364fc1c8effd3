#include "transport/group.h"

#include <algorithm>

#include "device/device.h"

namespace hocc {
namespace {

std::string describe(int stage, const std::vector<int>& ranks) {
  std::string s = "stage " + std::to_string(stage) + " group [";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "]";
}

}  // namespace

GroupTransport::GroupTransport(int rank, int size, std::unique_ptr<Device> device)
    : rank_(rank), size_(size), device_(std::move(device)) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error("hocc: rank " + std::to_string(rank) + " of a group of " + std::to_string(size));
}

void GroupTransport::prepare(const Plan& plan) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const Step& s : plan.steps())
    for (const GroupSlice& g : s.groups)
      if (g.ranks.size() > 1 && std::count(g.ranks.begin(), g.ranks.end(), rank_) &&
          !comms_.count({s.stage, g.ranks, s.impl}))
        throw Error("hocc: no communicator for " + describe(s.stage, g.ranks) +
                    " (the engine sets them up before a plan runs)");
}

Comm& GroupTransport::comm(int stage, const std::vector<int>& ranks, Impl impl) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = comms_.find({stage, ranks, impl});
  if (it == comms_.end()) throw Error("hocc: no communicator for " + describe(stage, ranks));
  return *it->second;
}

void GroupTransport::begin(const CallId& call) {
  std::lock_guard<std::mutex> lk(mu_);
  call_ = call;
}

void GroupTransport::abort(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [key, c] : comms_) c->abort(why);
}

void GroupTransport::add(int stage, const std::vector<int>& ranks, Impl impl, std::shared_ptr<Comm> comm) {
  if (!comm) throw Error("hocc: no communicator given for " + describe(stage, ranks));
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end() || comm->me != int(it - ranks.begin()) || comm->n != int(ranks.size()))
    throw Error("hocc: the communicator for " + describe(stage, ranks) + " is member " + std::to_string(comm->me) +
                " of " + std::to_string(comm->n) + ", which does not match rank " + std::to_string(rank_));
  comm->ranks = ranks;
  std::lock_guard<std::mutex> lk(mu_);
  comm->call = &call_;
  comms_[{stage, ranks, impl}] = std::move(comm);
}

bool GroupTransport::has(int stage, const std::vector<int>& ranks, Impl impl) const {
  std::lock_guard<std::mutex> lk(mu_);
  return comms_.count({stage, ranks, impl}) > 0;
}

size_t GroupTransport::held_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& [key, c] : comms_) n += c->held_bytes();
  return n;
}

void GroupTransport::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  comms_.clear();
}

}  // namespace hocc
