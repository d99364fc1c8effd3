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

// Every failure the library raises; Python sees it as RuntimeError.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The ranks are not in the same call (count, dtype, op, algo, or a skipped
// call): Python sees hocc._C.HoccMismatchError, which hocc raises as
// hocc.CallMismatchError. Kept through every re-wrap that adds context.
struct MismatchError : Error {
  using Error::Error;
};

// `e`'s kind (Error or MismatchError) again, its text behind `context`
[[noreturn]] inline void rethrow_with(const std::string& context, const std::exception& e) {
  if (dynamic_cast<const MismatchError*>(&e)) throw MismatchError(context + e.what());
  throw Error(context + e.what());
}

}  // namespace hocc
