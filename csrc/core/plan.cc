#include "core/plan.h"

#include "core/types.h"

namespace hocc {

Op parse_plan_op(const std::string& n) {
  if (n == "reduce_scatter") return Op::reduce_scatter;
  if (n == "all_gather") return Op::all_gather;
  if (n == "all_reduce") return Op::all_reduce;
  throw Error("hocc: unknown plan op '" + n + "'");
}

Impl parse_impl(const std::string& n) {
  if (n == "native") return Impl::native;
  if (n == "ring") return Impl::ring;
  if (n == "shm") return Impl::shm;
  throw Error("hocc: unknown plan impl '" + n + "'");
}

}  // namespace hocc
