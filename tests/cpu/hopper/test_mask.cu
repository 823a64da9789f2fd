// The mask policies (hopper/mask.cuh), checked on the host against their definition:
// the causal / sequence-end column bits for every bound and fragment width the kernels
// use (a wrong bit would show on the GPU only for rows whose bound falls on that
// column), the key blocks a range of query rows needs (too few would drop keys, too
// many would leave a warpgroup computing blocks it could skip), and the query blocks
// the backward's tile of a key block walks (too late a start drops gradients).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "hopper/fwd_params.h"
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

// The backward's tile of key block n walks query blocks [begin, end): every block with
// a row that sees one of its keys, and (begin) none before the first such block.
template <int kBlockM, int kBlockN, class Mask>
void expect_query_blocks_match_definition() {
  const int lens[][2] = {{1, 1},     {3, 17},    {17, 3},     {64, 64},     {127, 129}, {128, 128}, {129, 127},
                         {239, 799}, {799, 239}, {1000, 1000}, {1024, 1023}, {1025, 1},  {1, 1025}};
  for (const auto& len : lens) {
    FwdParams p{};
    p.seqlen_q = len[0];
    p.seqlen_k = len[1];
    const Mask mask(p);
    for (int n = 0; n * kBlockN < p.seqlen_k; ++n) {
      int first_seen = -1;
      for (int row = 0; row < p.seqlen_q && first_seen < 0; ++row) {
        if (mask.visible_end(row) > n * kBlockN) first_seen = row;
      }
      int begin = -1;
      const int end = mask.template query_blocks<kBlockM, kBlockN>(n, &begin);
      EXPECT_EQ(end, (p.seqlen_q + kBlockM - 1) / kBlockM);
      // With a bottom-right aligned causal mask some row sees every key; were there a key
      // block no row sees, its tile would have nothing to add wherever it started.
      ASSERT_GE(first_seen, 0);
      EXPECT_EQ(begin, first_seen / kBlockM) << (Mask::kCausal ? "causal" : "no mask") << " sq " << p.seqlen_q
                                             << " sk " << p.seqlen_k << " key block " << n << " of " << kBlockN;
    }
  }
}

TEST(MaskQueryBlocks, MatchDefinitionForKeyBlocks) {
  expect_query_blocks_match_definition<64, 128, CausalMask>();
  expect_query_blocks_match_definition<128, 128, CausalMask>();
  expect_query_blocks_match_definition<64, 80, CausalMask>();
  expect_query_blocks_match_definition<64, 96, CausalMask>();
  expect_query_blocks_match_definition<64, 128, NoMask>();
  expect_query_blocks_match_definition<64, 80, NoMask>();
}

}  // namespace
}  // namespace fa3::hopper
