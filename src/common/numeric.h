// fa3 — host-side conversions between fp32 and the 16- and 8-bit storage types.
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

// e4m3 (float8_e4m3fn: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
// infinities, 0x7f / 0xff are NaN; largest finite 448, smallest subnormal 2^-9).
inline float e4m3_to_float(std::uint8_t code) {
  const float sign = (code & 0x80u) ? -1.f : 1.f;
  const int exp = (code >> 3) & 0xf;
  const int man = code & 0x7;
  if (exp == 0xf && man == 0x7) return std::copysign(NAN, sign);
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);
  return sign * std::ldexp(static_cast<float>(8 + man), exp - 10);
}

// fp32 to e4m3 as the GPU's cvt.rn.satfinite.e4m3x2.f32 does it: round to nearest,
// ties to even; anything beyond the largest finite value, infinities included,
// saturates to +-448; NaN stays NaN (0x7f, with its sign).
inline std::uint8_t float_to_e4m3(float f) {
  const std::uint8_t sign = (float_to_bits(f) >> 24) & 0x80u;
  if (std::isnan(f)) return static_cast<std::uint8_t>(sign | 0x7fu);
  const float a = std::fabs(f);
  if (a >= 448.f) return static_cast<std::uint8_t>(sign | 0x7eu);
  if (a < 0.015625f) {
    // Below the smallest normal 2^-6: multiples of 2^-9, rounded to nearest even (a
    // value that rounds up to 8 * 2^-9 is the smallest normal, code 0x08, as wanted).
    return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(std::nearbyint(std::ldexp(a, 9))));
  }
  const std::uint32_t abits = float_to_bits(a);
  const std::uint32_t exp = (abits >> 23) - 120u;  // rebias 127 -> 7
  const std::uint32_t man = abits & 0x7fffffu;
  std::uint32_t code = (exp << 3) | (man >> 20);
  const std::uint32_t rest = man & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;  // carries into exp correctly
  // Values in (448, 464) round down to 448 above; those from the midpoint 464 on were
  // caught by the saturation test, so code never reaches the NaN pattern 0x7f.
  return static_cast<std::uint8_t>(sign | code);
}

inline float round_to_e4m3(float v) { return e4m3_to_float(float_to_e4m3(v)); }

// Reads element `i` (flat, already offset) of a buffer of `dtype` as fp32.
inline float load_as_float(const void* base, std::int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kBFloat16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kFloat16: return fp16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kFloat8E4M3: return e4m3_to_float(static_cast<const std::uint8_t*>(base)[i]);
    case DType::kInt32: break;
  }
  return NAN;
}

inline void store_from_float(void* base, std::int64_t i, DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[i] = v; return;
    case DType::kBFloat16: static_cast<std::uint16_t*>(base)[i] = float_to_bf16(v); return;
    case DType::kFloat16: static_cast<std::uint16_t*>(base)[i] = float_to_fp16(v); return;
    case DType::kFloat8E4M3: static_cast<std::uint8_t*>(base)[i] = float_to_e4m3(v); return;
    case DType::kInt32: return;
  }
}

// Rounds v to the nearest value representable in `dtype` (identity for fp32).
inline float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(v));
    case DType::kFloat16: return fp16_to_float(float_to_fp16(v));
    case DType::kFloat8E4M3: return round_to_e4m3(v);
    default: return v;
  }
}

}  // namespace fa3::numeric
