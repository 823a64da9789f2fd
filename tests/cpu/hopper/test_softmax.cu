// The online softmax's growth bound (hopper/softmax.cuh): a reference left in place
// while a row's max grows by up to kMaxGrowthLog2 must keep the weights in range, which
// for the FP8 kernels' shifted P means below e4m3's largest value.
#include <gtest/gtest.h>

#include <cmath>

#include "hopper/softmax.cuh"

namespace fa3::hopper {
namespace {

TEST(Softmax, SixteenBitWeightsGrowUpToTwoToTheEight) {
  EXPECT_EQ((OnlineSoftmax<2, true, 0>::kMaxGrowthLog2), 8.f);
}

TEST(Softmax, ShiftedWeightsStayBelowE4m3sLargestValue) {
  constexpr double kE4m3Max = 448.0;
  constexpr float growth = OnlineSoftmax<2, true, 8>::kMaxGrowthLog2;
  EXPECT_GT(growth, 0.5f);
  // The largest weight a lazy reference lets through, with ex2.approx's relative error
  // (2^-22) on top, still rounds to a finite e4m3 value below saturation.
  const double largest = std::exp2(8.0 + growth) * (1.0 + std::exp2(-22.0));
  EXPECT_LT(largest, kE4m3Max);
  EXPECT_GT(std::exp2(kE4m3MaxLog2 + 0.01), kE4m3Max) << "the bound is log2(448) rounded down";
}

}  // namespace
}  // namespace fa3::hopper
