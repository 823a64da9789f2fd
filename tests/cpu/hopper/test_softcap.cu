// The softcap's tanh (hopper/softcap.cuh), checked on the host with an exact exp2: the
// polynomial guess and Newton steps must leave tanh accurate to fp32 rounding, so that
// on the GPU only ex2's own error (about 2e-7 absolute) remains; odd, exactly +-1 far
// out, and finite everywhere.
#include <gtest/gtest.h>

#include <cmath>

#include "hopper/softcap.cuh"

namespace fa3::hopper {
namespace {

constexpr double kMinusTwoLog2e = -2.8853900817779268;

TEST(Softcap, TanhMatchesTheDefinitionToFp32Rounding) {
  // Scales as kernels pass them: softmax scale / cap for head dims 64-256 and caps 5-50.
  for (double scale : {1.0, 0.125 / 5.0, 0.0884 / 30.0, 0.0625 / 50.0}) {
    const float k = static_cast<float>(kMinusTwoLog2e * scale);
    double worst = 0;
    for (int i = -200000; i <= 200000; ++i) {
      const float x = static_cast<float>(i / 200000.0 * 12.0 / scale);
      const double exact = std::tanh(static_cast<double>(x) * scale);
      worst = std::max(worst, std::abs(static_cast<double>(tanh_scaled(x, k)) - exact));
    }
    EXPECT_LE(worst, 3e-7) << "scale " << scale;
  }
}

TEST(Softcap, TanhIsOddSaturatesAndStaysFinite) {
  const float k = static_cast<float>(kMinusTwoLog2e * 0.02);
  EXPECT_EQ(tanh_scaled(0.f, k), 0.f);
  for (float x : {0.5f, 3.f, 77.f, 1e3f}) EXPECT_EQ(tanh_scaled(-x, k), -tanh_scaled(x, k)) << x;
  EXPECT_EQ(tanh_scaled(1e6f, k), 1.f);
  EXPECT_EQ(tanh_scaled(-1e6f, k), -1.f);
  EXPECT_EQ(tanh_scaled(3e38f, k), 1.f);
}

}  // namespace
}  // namespace fa3::hopper
