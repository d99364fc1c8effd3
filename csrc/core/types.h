// Element types and reduction ops the executors understand. Python passes
// them by name; everything below works on these enums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hocc {

enum class DType : int { f32, f64, f16, bf16, i8, u8, i32, i64 };

// AVG travels as SUM (the caller divides once at the end); NONE means "copy".
enum class RedOp : int { none, sum, prod, min, max };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::i8: case DType::u8: return 1;
  }
  return 0;
}

DType parse_dtype(const std::string& name);     // "float32", "bfloat16", ...
RedOp parse_op(const std::string& name);        // "sum", "avg", "product", "min", "max"
const char* dtype_name(DType t);
std::vector<std::string> dtype_names();  // every DType's, in code order

// Where in a plan a failure happened: the step that raised it (stage -1: outside any step).
struct Where {
  int stage = -1, chunk = -1;
  std::string step;        // "native all_reduce", "shm reduce_scatter", ...
  std::vector<int> ranks;  // its group: the peers the failure involves
  std::string tier;        // the link tier its stage crosses ("host", "net", ...; "" if the plan names none)
  // "at stage 1 (net), chunk 0, ucx all_reduce over ranks [0,4]": the one wording of a failed step
  std::string text() const;
};

// Every failure the library raises; Python sees it as hocc._C.HoccNativeError, a RuntimeError whose
// fields (stage, chunk, step, ranks, cause) the engine reads instead of parsing the text.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
  Error(const std::string& what, Where at, std::string why)
      : std::runtime_error(what), where(std::move(at)), cause(std::move(why)) {}
  Where where;
  std::string cause;  // the failure in its own words, without the step's context (empty: what())
};

// The ranks are not in the same call (count, dtype, op, algo, or a skipped
// call): Python sees hocc._C.HoccMismatchError, which hocc raises as
// hocc.CallMismatchError. Kept through every re-wrap that adds context.
struct MismatchError : Error {
  using Error::Error;
};

// `e`'s kind again, placed at the step `at` (its text behind the step's words)
[[noreturn]] inline void rethrow_at(Where at, const std::string& context, const std::exception& e) {
  const auto* err = dynamic_cast<const Error*>(&e);
  std::string cause = err && !err->cause.empty() ? err->cause : e.what();
  if (dynamic_cast<const MismatchError*>(&e)) throw MismatchError(context + e.what(), std::move(at), cause);
  throw Error(context + e.what(), std::move(at), cause);
}

}  // namespace hocc
