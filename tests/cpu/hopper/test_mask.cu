// The causal / sequence-end mask's column bits (hopper/mask.cuh), checked on the host
// against the definition for every bound and fragment width the kernels use: a wrong
// bit would show on the GPU only for rows whose bound falls on that column.
#include <gtest/gtest.h>

#include <cstdint>

#include "hopper/mask.cuh"

namespace fa3::hopper {
namespace {

template <class Bits, int kPairs>
void expect_matches_definition() {
  for (int end = -20; end <= 8 * kPairs + 20; ++end) {
    const Bits bits = visible_columns<Bits, kPairs>(end);
    for (int c = 0; c < static_cast<int>(8 * sizeof(Bits)); ++c) {
      const bool exists = c < 2 * kPairs;
      const bool visible = exists && (c % 2) + 8 * (c / 2) < end;
      EXPECT_EQ(static_cast<bool>((bits >> c) & 1), visible) << "pairs " << kPairs << " end " << end << " bit " << c;
    }
  }
}

TEST(MaskColumns, MatchDefinitionForEveryBound) {
  expect_matches_definition<std::uint32_t, 16>();  // 128-key blocks
  expect_matches_definition<std::uint32_t, 12>();  // 96
  expect_matches_definition<std::uint32_t, 10>();  // 80
  expect_matches_definition<std::uint32_t, 8>();   // 64
  expect_matches_definition<std::uint64_t, 22>();  // 176
  expect_matches_definition<std::uint64_t, 32>();  // 256
}

}  // namespace
}  // namespace fa3::hopper
