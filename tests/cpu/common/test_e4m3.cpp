// The e4m3 conversions of common/numeric.h: every code, every rounding boundary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/numeric.h"

namespace fa3::numeric {
namespace {

bool is_nan_code(int code) { return (code & 0x7f) == 0x7f; }

// The value of a code from the format's definition, written independently of
// e4m3_to_float: (-1)^s * 2^(e - 7) * (1 + m / 8), or 2^-6 * m / 8 when e == 0.
double definition(int code) {
  const int s = code >> 7, e = (code >> 3) & 0xf, m = code & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// The finite non-negative codes in increasing order of value: 0x00 .. 0x7e.
std::vector<int> positive_codes() {
  std::vector<int> codes;
  for (int c = 0; c < 0x7f; ++c) codes.push_back(c);
  return codes;
}

TEST(E4m3, DecodesEveryCodeByTheDefinition) {
  for (int code = 0; code < 256; ++code) {
    const float v = e4m3_to_float(static_cast<std::uint8_t>(code));
    if (is_nan_code(code)) {
      EXPECT_TRUE(std::isnan(v)) << code;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), definition(code)) << code;
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.f, -9));
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
}

TEST(E4m3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const std::uint8_t c = static_cast<std::uint8_t>(code);
    const std::uint8_t back = float_to_e4m3(e4m3_to_float(c));
    if (is_nan_code(code)) {
      EXPECT_TRUE(is_nan_code(back)) << code;
      EXPECT_EQ(back & 0x80, code & 0x80) << "NaN keeps its sign, code " << code;
    } else {
      EXPECT_EQ(back, c) << code;
    }
  }
}

// Between two neighbours a < b: just below the midpoint rounds to a, just above to b,
// the midpoint itself to the one whose code is even. Midpoints of e4m3 neighbours are
// exact in fp32 (they need 4 mantissa bits), and so are their fp32 neighbours.
TEST(E4m3, RoundsToNearestEvenAtEveryBoundary) {
  const std::vector<int> codes = positive_codes();
  for (std::size_t i = 0; i + 1 < codes.size(); ++i) {
    const int lo = codes[i], hi = codes[i + 1];
    const float a = e4m3_to_float(static_cast<std::uint8_t>(lo));
    const float b = e4m3_to_float(static_cast<std::uint8_t>(hi));
    const float mid = (a + b) / 2;
    ASSERT_EQ(static_cast<double>(mid), (definition(lo) + definition(hi)) / 2);
    const int even = (lo % 2 == 0) ? lo : hi;
    for (const float sign : {1.f, -1.f}) {
      const int s = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(float_to_e4m3(sign * std::nextafter(mid, 0.f)), s | lo) << a << " .. " << b;
      EXPECT_EQ(float_to_e4m3(sign * std::nextafter(mid, 1000.f)), s | hi) << a << " .. " << b;
      EXPECT_EQ(float_to_e4m3(sign * mid), s | even) << a << " .. " << b;
    }
  }
}

TEST(E4m3, SaturatesBeyond448AndKeepsNan) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float v : {448.f, std::nextafter(448.f, 1000.f), 463.99f, 464.f, 480.f, 1e6f, 3e38f, inf}) {
    EXPECT_EQ(float_to_e4m3(v), 0x7e) << v;
    EXPECT_EQ(float_to_e4m3(-v), 0xfe) << -v;
  }
  EXPECT_TRUE(is_nan_code(float_to_e4m3(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
  // Below half the smallest subnormal: zero, with the input's sign.
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.f, -10)), 0x00);  // a tie: to even, 0
  EXPECT_EQ(float_to_e4m3(std::nextafter(std::ldexp(1.f, -10), 1.f)), 0x01);
  EXPECT_EQ(float_to_e4m3(-1e-30f), 0x80);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

// Random fp32 values of every magnitude against a search for the nearest code.
TEST(E4m3, MatchesNearestCodeSearch) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-14.f, 10.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const std::vector<int> codes = positive_codes();
  for (int trial = 0; trial < 200000; ++trial) {
    const float v = std::exp2(exponent(rng)) * (unit(rng) < 0.5f ? -1.f : 1.f);
    const double a = std::fabs(static_cast<double>(v));
    int best = 0;
    double best_err = std::numeric_limits<double>::infinity();
    for (int c : codes) {
      const double err = std::fabs(definition(c) - a);
      if (err < best_err || (err == best_err && c % 2 == 0)) best = c, best_err = err;
    }
    if (a > 448.0) best = 0x7e;
    EXPECT_EQ(float_to_e4m3(v), (v < 0 ? 0x80 : 0) | best) << v;
  }
}

TEST(E4m3, StorageHelpersUseTheConversions) {
  std::uint8_t buf[2] = {};
  store_from_float(buf, 1, DType::kFloat8E4M3, 3.3f);
  EXPECT_EQ(buf[1], float_to_e4m3(3.3f));
  EXPECT_EQ(load_as_float(buf, 1, DType::kFloat8E4M3), 3.25f);
  EXPECT_EQ(round_to(DType::kFloat8E4M3, 3.3f), 3.25f);
}

}  // namespace
}  // namespace fa3::numeric
