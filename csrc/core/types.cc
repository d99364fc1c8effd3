#include "core/types.h"

namespace hocc {

DType parse_dtype(const std::string& n) {
  if (n == "float32") return DType::f32;
  if (n == "float64") return DType::f64;
  if (n == "float16") return DType::f16;
  if (n == "bfloat16") return DType::bf16;
  if (n == "int8") return DType::i8;
  if (n == "uint8") return DType::u8;
  if (n == "int32") return DType::i32;
  if (n == "int64") return DType::i64;
  throw Error("hocc: unsupported dtype '" + n +
              "'; use float32, float64, float16, bfloat16, int8, uint8, int32 or int64");
}

RedOp parse_op(const std::string& n) {
  if (n == "sum" || n == "avg") return RedOp::sum;
  if (n == "product" || n == "prod") return RedOp::prod;
  if (n == "min") return RedOp::min;
  if (n == "max") return RedOp::max;
  throw Error("hocc: unsupported reduction op '" + n + "'; use sum, avg, product, min or max");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i8: return "int8";
    case DType::u8: return "uint8";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

std::vector<std::string> dtype_names() {
  std::vector<std::string> out;
  for (int t = int(DType::f32); t <= int(DType::i64); ++t) out.push_back(dtype_name(DType(t)));
  return out;
}

std::string Where::text() const {
  std::string r;
  for (size_t i = 0; i < ranks.size(); ++i) r += (i ? "," : "") + std::to_string(ranks[i]);
  return "at stage " + std::to_string(stage) + (tier.empty() ? "" : " (" + tier + ")") + ", chunk " +
         std::to_string(chunk) + ", " + step + " over ranks [" + r + "]";
}

}  // namespace hocc
