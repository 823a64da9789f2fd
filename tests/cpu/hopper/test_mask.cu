// The mask policies (hopper/mask.cuh), checked on the host against their definition:
// the causal / sequence-end column bits for every bound and fragment width the kernels
// use (a wrong bit would show on the GPU only for rows whose bound falls on that
// column), and the key blocks a range of query rows needs (too few would drop keys,
// too many would leave a warpgroup computing blocks it could skip).
#include <gtest/gtest.h>

#include <algorithm>
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

// The key blocks rows [begin, begin + rows) need: up to the furthest key any existing
// row sees, from the policy's visible_end.
template <int kBlockN, class Mask>
int key_blocks_by_definition(const Mask& mask, int seqlen_q, int begin, int rows) {
  int end = 0;
  for (int row = begin; row < std::min(begin + rows, seqlen_q); ++row) end = std::max(end, mask.visible_end(row));
  return (end + kBlockN - 1) / kBlockN;
}

template <int kBlockN, class Mask>
void expect_key_blocks_match_definition() {
  const int lens[][2] = {{1, 1},     {3, 17},    {17, 3},     {64, 64},     {127, 129}, {128, 128}, {129, 127},
                         {239, 799}, {799, 239}, {1000, 1000}, {1024, 1023}, {1025, 1},  {1, 1025}};
  for (const auto& len : lens) {
    FwdParams p{};
    p.seqlen_q = len[0];
    p.seqlen_k = len[1];
    const Mask mask(p);
    for (int rows : {64, 128, 192}) {
      for (int begin = 0; begin < p.seqlen_q + 192; begin += 64) {
        EXPECT_EQ(mask.template key_blocks<kBlockN>(begin, begin + rows),
                  key_blocks_by_definition<kBlockN>(mask, p.seqlen_q, begin, rows))
            << (Mask::kCausal ? "causal" : "no mask") << " sq " << p.seqlen_q << " sk " << p.seqlen_k << " rows ["
            << begin << ", " << begin + rows << ") block " << kBlockN;
      }
    }
  }
}

TEST(MaskKeyBlocks, MatchDefinitionForRowRanges) {
  expect_key_blocks_match_definition<128, CausalMask>();
  expect_key_blocks_match_definition<80, CausalMask>();
  expect_key_blocks_match_definition<96, CausalMask>();
  expect_key_blocks_match_definition<128, NoMask>();
  expect_key_blocks_match_definition<80, NoMask>();
}

}  // namespace
}  // namespace fa3::hopper
