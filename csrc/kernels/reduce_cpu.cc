#include "kernels/reduce_cpu.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace hocc {
namespace {

template <class To, class From>
inline To bits(From f) {
  To t;
  std::memcpy(&t, &f, sizeof(t));
  return t;
}

// float16: widen by re-biasing the exponent (a float multiply fixes it and
// normalizes subnormals); narrow with round-to-nearest-even.
struct Half {
  uint16_t v;
  static float load(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t out;
    if (em >= 0x7c00u) {
      out = 0x7f800000u | ((em & 0x3ffu) << 13);  // inf / nan
    } else {
      out = bits<uint32_t>(bits<float>(em << 13) * 0x1p112f);
    }
    return bits<float>(out | sign);
  }
  static uint16_t store(float f) {
    uint32_t u = bits<uint32_t>(f);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint32_t o;
    if (u >= (143u << 23)) {  // >= 65536: overflow to inf, or nan
      o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (u < (113u << 23)) {  // below the smallest normal half: let float addition round
      const uint32_t magic = 126u << 23;  // 0.5: its ulp is the half subnormal step
      o = bits<uint32_t>(bits<float>(u) + bits<float>(magic)) - magic;
    } else {
      uint32_t odd = (u >> 13) & 1u;
      u += (uint32_t(15 - 127) << 23) + 0xfffu + odd;
      o = u >> 13;
    }
    return uint16_t(o | (sign >> 16));
  }
};

struct BFloat {
  uint16_t v;
  static float load(uint16_t h) { return bits<float>(uint32_t(h) << 16); }
  static uint16_t store(float f) {
    uint32_t u = bits<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet nan
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
};

template <RedOp OP, class C>
inline C apply(C a, C b) {
  if constexpr (OP == RedOp::sum) {
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;  // wrap around like torch, without UB
      return C(U(a) + U(b));
    } else {
      return a + b;
    }
  } else if constexpr (OP == RedOp::prod) {
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<std::conditional_t<(sizeof(C) < 4), int, C>>;
      return C(U(a) * U(b));
    } else {
      return a * b;
    }
  } else if constexpr (OP == RedOp::min) {
    return b < a ? b : a;
  } else if constexpr (OP == RedOp::max) {
    return a < b ? b : a;
  } else {
    return b;
  }
}

// Storage T computed as C (the same, except half types computed as float).
template <class T, RedOp OP>
void reduce2(T* __restrict dst, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = apply<OP>(dst[i], src[i]);
}

template <class H, RedOp OP>
void reduce2_half(uint16_t* __restrict dst, const uint16_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = H::store(apply<OP>(H::load(dst[i]), H::load(src[i])));
}

template <class T, RedOp OP>
void reduce3(T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = apply<OP>(a[i], b[i]);
}

template <class H, RedOp OP>
void reduce3_half(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = H::store(apply<OP>(H::load(a[i]), H::load(b[i])));
}

template <RedOp OP>
void reduce_typed(void* dst, const void* src, size_t n, DType t) {
  switch (t) {
    case DType::f32: return reduce2<float, OP>(static_cast<float*>(dst), static_cast<const float*>(src), n);
    case DType::f64: return reduce2<double, OP>(static_cast<double*>(dst), static_cast<const double*>(src), n);
    case DType::i8: return reduce2<int8_t, OP>(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n);
    case DType::u8: return reduce2<uint8_t, OP>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
    case DType::i32: return reduce2<int32_t, OP>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n);
    case DType::i64: return reduce2<int64_t, OP>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n);
    case DType::f16:
      return reduce2_half<Half, OP>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
    case DType::bf16:
      return reduce2_half<BFloat, OP>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
  }
}

template <RedOp OP>
void reduce3_typed(void* dst, const void* a, const void* b, size_t n, DType t) {
#define HOCC_R3(T) \
  return reduce3<T, OP>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n)
  switch (t) {
    case DType::f32: HOCC_R3(float);
    case DType::f64: HOCC_R3(double);
    case DType::i8: HOCC_R3(int8_t);
    case DType::u8: HOCC_R3(uint8_t);
    case DType::i32: HOCC_R3(int32_t);
    case DType::i64: HOCC_R3(int64_t);
    case DType::f16:
      return reduce3_half<Half, OP>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                    static_cast<const uint16_t*>(b), n);
    case DType::bf16:
      return reduce3_half<BFloat, OP>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                      static_cast<const uint16_t*>(b), n);
  }
#undef HOCC_R3
}

void reduce3_any(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op) {
  switch (op) {
    case RedOp::sum: return reduce3_typed<RedOp::sum>(dst, a, b, n, t);
    case RedOp::prod: return reduce3_typed<RedOp::prod>(dst, a, b, n, t);
    case RedOp::min: return reduce3_typed<RedOp::min>(dst, a, b, n, t);
    case RedOp::max: return reduce3_typed<RedOp::max>(dst, a, b, n, t);
    case RedOp::none:
      if (dst != b) std::memmove(dst, b, n * dtype_size(t));
      return;
  }
}

}  // namespace

void reduce_cpu(void* dst, const void* src, size_t n, DType t, RedOp op) {
  if (n == 0) return;
  switch (op) {
    case RedOp::sum: return reduce_typed<RedOp::sum>(dst, src, n, t);
    case RedOp::prod: return reduce_typed<RedOp::prod>(dst, src, n, t);
    case RedOp::min: return reduce_typed<RedOp::min>(dst, src, n, t);
    case RedOp::max: return reduce_typed<RedOp::max>(dst, src, n, t);
    case RedOp::none:
      if (dst != src) std::memmove(dst, src, n * dtype_size(t));
      return;
  }
}

void reduce_cpu_many(void* dst, const void* const* srcs, int nsrc, size_t n, DType t, RedOp op) {
  if (n == 0 || nsrc == 0) return;
  const size_t es = dtype_size(t);
  if (nsrc == 1) {
    if (dst != srcs[0]) std::memmove(dst, srcs[0], n * es);
    return;
  }
  // dst may be one of the sources: read that one first, before dst is written
  std::vector<const void*> order(srcs, srcs + nsrc);
  for (int j = 1; j < nsrc; ++j)
    if (order[j] == dst) std::swap(order[0], order[j]);
  srcs = order.data();
  // 16 KiB of dst per block stays in L1 while every source streams through it
  const size_t block = std::max<size_t>(1, 16384 / es);
  auto* d = static_cast<char*>(dst);
  for (size_t start = 0; start < n; start += block) {
    const size_t len = std::min(block, n - start);
    const size_t off = start * es;
    reduce3_any(d + off, static_cast<const char*>(srcs[0]) + off, static_cast<const char*>(srcs[1]) + off, len,
                t, op);
    for (int j = 2; j < nsrc; ++j) reduce_cpu(d + off, static_cast<const char*>(srcs[j]) + off, len, t, op);
  }
}

namespace {
// Integer AVG as NCCL does it: the integer sum, then C's division (truncates toward zero).
template <typename T>
void divide_int(void* dst, size_t n, double divisor) {
  auto* d = static_cast<T*>(dst);
  const auto q = static_cast<int64_t>(divisor);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<int64_t>(d[i]) / q);
}
}  // namespace

void divide_cpu(void* dst, size_t n, DType t, double divisor) {
  switch (t) {
    case DType::f32: {
      auto* d = static_cast<float*>(dst);
      const float q = float(divisor);
      for (size_t i = 0; i < n; ++i) d[i] /= q;
      return;
    }
    case DType::f64: {
      auto* d = static_cast<double*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] /= divisor;
      return;
    }
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      const float q = float(divisor);
      for (size_t i = 0; i < n; ++i) d[i] = Half::store(Half::load(d[i]) / q);
      return;
    }
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      const float q = float(divisor);
      for (size_t i = 0; i < n; ++i) d[i] = BFloat::store(BFloat::load(d[i]) / q);
      return;
    }
    case DType::i8: return divide_int<int8_t>(dst, n, divisor);
    case DType::u8: return divide_int<uint8_t>(dst, n, divisor);
    case DType::i32: return divide_int<int32_t>(dst, n, divisor);
    case DType::i64: return divide_int<int64_t>(dst, n, divisor);
  }
  throw Error(std::string("hocc: AVG cannot divide dtype ") + dtype_name(t));
}

}  // namespace hocc
