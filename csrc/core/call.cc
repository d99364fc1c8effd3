#include "core/call.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <cstdio>
#include <map>

#include "core/plan.h"
#include "core/types.h"

namespace hocc {
namespace {

// indexed by Op (core/plan.h): a CallId's collective code is the Op's value
constexpr const char* kCollectives[] = {"all_reduce", "all_gather", "reduce_scatter"};
constexpr bool same(const char* a, const char* b) { return *a == *b && (*a == 0 || same(a + 1, b + 1)); }
static_assert(same(kCollectives[int(Op::all_reduce)], "all_reduce") &&
              same(kCollectives[int(Op::all_gather)], "all_gather") &&
              same(kCollectives[int(Op::reduce_scatter)], "reduce_scatter"));
constexpr int64_t kAllGather = int64_t(Op::all_gather);  // the one collective with no reduction op to agree on
const char* const kOps[] = {"sum", "avg", "product", "min", "max"};

template <size_t N>
int64_t code(const char* const (&names)[N], const std::string& name, const char* what) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return int64_t(i);
  if (name == "prod") return 2;
  throw Error(std::string("hocc: unknown ") + what + " '" + name + "'");
}

template <size_t N>
std::string name(const char* const (&names)[N], int64_t c) {
  return c >= 0 && size_t(c) < N ? names[c] : "?(" + std::to_string(c) + ")";
}

std::string algo_name(uint64_t a) {
  char s[9] = {};
  std::memcpy(s, &a, 8);
  return s;
}

std::string dtype_str(int64_t d) {
  return d >= 0 && d <= int64_t(DType::i64) ? dtype_name(DType(d)) : "?";
}

}  // namespace

std::vector<std::string> collective_names() { return {std::begin(kCollectives), std::end(kCollectives)}; }
std::vector<std::string> op_names() { return {std::begin(kOps), std::end(kOps)}; }

CallId make_call_id(uint64_t seq, uint64_t plan, int64_t count, const std::string& collective,
                    const std::string& dtype, const std::string& op, const std::string& algo) {
  CallId c;
  c.seq = seq, c.plan = plan, c.count = count;
  c.collective = code(kCollectives, collective, "collective");
  c.dtype = int64_t(parse_dtype(dtype));
  c.op = code(kOps, op, "reduction op");
  std::memcpy(&c.algo, algo.data(), std::min<size_t>(algo.size(), 8));
  return c;
}

std::string describe(const CallId& c) {
  std::string s = name(kCollectives, c.collective) + " of " + std::to_string(c.count) + " " + dtype_str(c.dtype);
  if (c.collective != kAllGather) s += " (" + name(kOps, c.op) + ", ";
  else s += " (";
  return s + algo_name(c.algo) + ", call " + std::to_string(c.seq) + ")";
}

std::string differences(const CallId& a, const CallId& b) {
  if (std::memcmp(&a, &b, sizeof(CallId)) == 0) return {};  // every call's case: no strings made for it
  if (b.magic != CallId::kMagic) return "it sent something that is not a hocc call header (another library's "
                                        "traffic on this group?)";
  std::string d;
  auto add = [&](const std::string& what, const std::string& mine, const std::string& theirs) {
    if (mine != theirs) d += (d.empty() ? "" : ", ") + what + " " + theirs + " vs this rank's " + mine;
  };
  add("call number", std::to_string(a.seq), std::to_string(b.seq));
  add("collective", name(kCollectives, a.collective), name(kCollectives, b.collective));
  add("count", std::to_string(a.count), std::to_string(b.count));
  add("dtype", dtype_str(a.dtype), dtype_str(b.dtype));
  if (a.collective != kAllGather || b.collective != kAllGather) add("reduction op", name(kOps, a.op), name(kOps, b.op));
  add("algo", algo_name(a.algo), algo_name(b.algo));
  if (d.empty() && a.plan != b.plan)
    d = "the plan (same call, but planned differently: do the ranks' HOCC_* settings differ?)";
  return d;
}

std::string group_differences(const std::vector<CallId>& rows) {
  std::string out;
  auto field = [&](const char* what, auto value) {
    std::map<std::string, std::vector<size_t>> by;  // value -> ranks, listed by their first rank below
    for (size_t r = 0; r < rows.size(); ++r) by[value(rows[r])].push_back(r);
    if (by.size() < 2) return;
    std::vector<std::pair<std::vector<size_t>, std::string>> groups;
    for (auto& [v, ranks] : by) groups.emplace_back(ranks, v);
    std::sort(groups.begin(), groups.end());
    std::string part;
    for (const auto& [ranks, v] : groups) {
      std::string who = ranks.size() == 1 ? "rank " : "ranks ";
      for (size_t i = 0; i < ranks.size(); ++i) who += (i ? "," : "") + std::to_string(ranks[i]);
      part += (part.empty() ? "" : "; ") + who + ": " + v;
    }
    out += (out.empty() ? "" : "; ") + std::string(what) + " (" + part + ")";
  };
  field("header", [](const CallId& c) { return std::string(c.magic == CallId::kMagic ? "hocc" : "not hocc's"); });
  field("call number", [](const CallId& c) { return std::to_string(c.seq); });
  field("collective", [](const CallId& c) { return name(kCollectives, c.collective); });
  field("count", [](const CallId& c) { return std::to_string(c.count); });
  field("dtype", [](const CallId& c) { return dtype_str(c.dtype); });
  bool reduces = std::any_of(rows.begin(), rows.end(), [](const CallId& c) { return c.collective != kAllGather; });
  if (reduces)  // all_gather has no reduction op to agree on
    field("reduction op", [](const CallId& c) { return c.collective == kAllGather ? "-" : name(kOps, c.op); });
  field("algo", [](const CallId& c) { return algo_name(c.algo); });
  if (out.empty()) {  // a different plan follows from any difference above; alone, it is the settings
    field("plan", [](const CallId& c) {
      char hex[19];
      std::snprintf(hex, sizeof hex, "0x%016llx", static_cast<unsigned long long>(c.plan));
      return std::string(hex);
    });
  }
  return out;
}

}  // namespace hocc
