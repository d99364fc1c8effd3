#include "core/plan.h"

#include "core/types.h"

namespace hocc {

Op parse_plan_op(const std::string& n) {
  if (n == "reduce_scatter") return Op::reduce_scatter;
  if (n == "all_gather") return Op::all_gather;
  if (n == "all_reduce") return Op::all_reduce;
  throw Error("hocc: unknown plan collective '" + n + "'");
}

Impl parse_impl(const std::string& n) {
  if (n == "native") return Impl::native;
  if (n == "ring") return Impl::ring;
  if (n == "shm") return Impl::shm;
  throw Error("hocc: unknown plan impl '" + n + "'");
}

const char* op_name(Op op) {
  switch (op) {
    case Op::reduce_scatter: return "reduce_scatter";
    case Op::all_gather: return "all_gather";
    case Op::all_reduce: return "all_reduce";
  }
  return "?";
}

const char* impl_name(Impl i) {
  switch (i) {
    case Impl::native: return "native";
    case Impl::ring: return "ring";
    case Impl::shm: return "shm";
  }
  return "?";
}

Buf parse_buf(const std::string& n) {
  if (n == "work") return Buf::work;
  if (n == "input") return Buf::input;
  if (n == "output") return Buf::output;
  throw Error("hocc: unknown plan buffer '" + n + "'");
}

WorkAt parse_work_at(const std::string& n) {
  if (n == "scratch") return WorkAt::scratch;
  if (n == "output") return WorkAt::output;
  if (n == "none") return WorkAt::none;
  throw Error("hocc: unknown work buffer place '" + n + "'");
}

}  // namespace hocc
