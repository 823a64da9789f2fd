// Problem's mask bounds and FLOP count (api/problem.h), on problems small enough to
// count by hand.
#include <gtest/gtest.h>

#include "api/problem.h"

namespace fa3 {
namespace {

Problem square(std::int64_t n) {
  Problem p;
  p.batch = 1;
  p.nheads_q = 1;
  p.nheads_kv = 1;
  p.head_dim = 1;
  p.head_dim_v = 1;
  p.seqlen_q = n;
  p.seqlen_k = n;
  return p;
}

// The SMs a call's kernels use: all but sm_margin, one at least.
TEST(Problem, SmMarginLeavesSmsFreeAndOneInUse) {
  Problem p = square(1);
  EXPECT_EQ(p.usable_sms(132), 132);
  p.sm_margin = 4;
  EXPECT_EQ(p.usable_sms(132), 128);
  p.sm_margin = 131;
  EXPECT_EQ(p.usable_sms(132), 1);
  p.sm_margin = 500;
  EXPECT_EQ(p.usable_sms(132), 1);
}

// Ten positions in chunks of four: [0, 3], [4, 7], [8, 9].
TEST(Problem, ChunksBoundEachRowsKeys) {
  Problem p = square(10);
  p.chunk = 4;
  EXPECT_EQ(p.first_key(5), 4);
  EXPECT_EQ(p.last_key(5), 7);
  EXPECT_EQ(p.first_key(9), 8);
  EXPECT_EQ(p.last_key(9), 9);
  // 4 + 4 + 2 keys per row in the three chunks: 16 + 16 + 4 pairs.
  EXPECT_DOUBLE_EQ(p.forward_flops(), 4.0 * 36);
  p.causal = true;
  p.window_right = 0;
  EXPECT_EQ(p.last_key(5), 5);
  // Causal inside each chunk: 1+2+3+4 twice, then 1+2.
  EXPECT_DOUBLE_EQ(p.forward_flops(), 4.0 * 23);
}

// Queries before key 0 (more queries than keys) fall in chunks that hold no key.
TEST(Problem, QueriesBeforeTheFirstKeySeeNoChunk) {
  Problem p = square(4);
  p.seqlen_q = 9;
  p.chunk = 3;
  // Query 4 sits at key -1, in chunk [-3, -1].
  EXPECT_GT(p.first_key(4), p.last_key(4));
  // Query 5 sits at key 0, in chunk [0, 2].
  EXPECT_EQ(p.first_key(5), 0);
  EXPECT_EQ(p.last_key(5), 2);
}

// Q K^T costs 2 * d and P V 2 * dv FLOPs per visible pair: (192, 128) counts 640, not
// 4 * 192, per pair.
TEST(Problem, FlopsCountEachHeadDimOnce) {
  Problem p = square(8);
  p.batch = 2;
  p.nheads_q = 3;
  p.head_dim = 192;
  p.head_dim_v = 128;
  EXPECT_DOUBLE_EQ(p.forward_flops(), 2.0 * 2 * 3 * 64 * (192 + 128));
  p.causal = true;
  p.window_right = 0;
  EXPECT_DOUBLE_EQ(p.forward_flops(), 0.5 * 2.0 * 2 * 3 * 64 * (192 + 128));
}

}  // namespace
}  // namespace fa3
