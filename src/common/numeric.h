// fa3 — host-side conversions between fp32 and the 16-bit storage types.
//
// Bit-exact with the GPU's round-to-nearest-even conversions, so that CPU
// references see exactly the values the kernels see.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "fa3/tensor.h"

namespace fa3::numeric {

inline float bits_to_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline std::uint32_t float_to_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bf16_to_float(std::uint16_t h) { return bits_to_float(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits = float_to_bits(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // keep NaN a NaN
  std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

inline float fp16_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // Subnormal: value = man * 2^-24.
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline std::uint16_t float_to_fp16(float f) {
  std::uint32_t bits = float_to_bits(f);
  std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 65520.f) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (a < 6.103515625e-05f) {
    // Subnormal range: quantize to multiples of 2^-24 with round-to-nearest-even.
    float q = std::nearbyint(std::ldexp(a, 24));
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(q));
  }
  std::uint32_t abits = float_to_bits(a);
  std::uint32_t exp = (abits >> 23) - 112u;
  std::uint32_t man = abits & 0x7fffffu;
  std::uint32_t half = (exp << 10) | (man >> 13);
  std::uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // carries into exp correctly
  return static_cast<std::uint16_t>(sign | half);
}

// Reads element `i` (flat, already offset) of a buffer of `dtype` as fp32.
inline float load_as_float(const void* base, std::int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kBFloat16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kFloat16: return fp16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kFloat8E4M3:
    case DType::kInt32: break;
  }
  return NAN;
}

inline void store_from_float(void* base, std::int64_t i, DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[i] = v; return;
    case DType::kBFloat16: static_cast<std::uint16_t*>(base)[i] = float_to_bf16(v); return;
    case DType::kFloat16: static_cast<std::uint16_t*>(base)[i] = float_to_fp16(v); return;
    case DType::kFloat8E4M3:
    case DType::kInt32: return;
  }
}

// Rounds v to the nearest value representable in `dtype` (identity for fp32).
inline float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(v));
    case DType::kFloat16: return fp16_to_float(float_to_fp16(v));
    default: return v;
  }
}

}  // namespace fa3::numeric
