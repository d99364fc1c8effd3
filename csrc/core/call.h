// What every member of a group must agree on before one call's bytes move.
// Ranks exchange it over each communicator at the call's first op on it
// (transport/c10d.cc, transport/shm.cc): a rank that skipped a call, or passed
// another count, dtype, reduction op or algo, is caught there and every member
// raises, instead of gloo aborting the process on a size mismatch or a wrong
// result coming back. Fixed size, so the exchange itself can never mismatch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hocc {

struct CallId {
  static constexpr uint64_t kMagic = 0x686f63632d63616cULL;  // "hocc-cal"
  uint64_t magic = kMagic;
  uint64_t seq = 0;        // the engine's call number, counted alike on every rank
  uint64_t plan = 0;       // a hash of the plan: every message's size follows from it
  int64_t count = 0;       // elements per rank, as hocc.plan counts them
  int64_t collective = 0;  // 0 all_reduce, 1 all_gather, 2 reduce_scatter
  int64_t dtype = 0;       // DType
  int64_t op = 0;          // 0 sum, 1 avg, 2 product, 3 min, 4 max
  uint64_t algo = 0;       // the algo's name, its first 8 characters
};
static_assert(sizeof(CallId) == 64, "CallId travels as 64 bytes");

CallId make_call_id(uint64_t seq, uint64_t plan, int64_t count, const std::string& collective,
                    const std::string& dtype, const std::string& op, const std::string& algo);
// the names a CallId's collective and op codes stand for, by code (Python's agreement reads these)
std::vector<std::string> collective_names();
std::vector<std::string> op_names();
// "all_reduce of 1000 float32 (sum, ho_ring, call 5)"
std::string describe(const CallId& c);
// "" when the two agree, else what differs: "count 1017 vs 1000, ..."
std::string differences(const CallId& mine, const CallId& theirs);
// every rank's CallId (by group rank): "" when all agree, else per field that differs which ranks have
// which value: "count (ranks 0,1,2: 1000; rank 3: 1017)" (HOCC_CHECK=all's comparison over the group)
std::string group_differences(const std::vector<CallId>& rows);

}  // namespace hocc
