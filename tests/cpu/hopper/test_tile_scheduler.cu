// The persistent tile order (hopper/tile_scheduler.cuh), checked on the host: every
// (query block, head, batch) tile exactly once, causal groups longest first, and the
// L2 head-group sizes. A tile missed or run twice would be a wrong or racy output
// that only some shapes show, so the shapes below include uneven groups. Also each
// tile's sequence bounds, fixed-length and varlen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {
namespace {

struct Case {
  int m_blocks, heads, batch, group;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int m : {1, 2, 7, 16})
    for (int h : {1, 3, 8})
      for (int b : {1, 2, 5})
        for (int g : {1, 2, 3, 8, 64}) out.push_back({m, h, b, g});
  return out;
}

template <bool kCausal>
void expect_each_tile_once(const Case& c) {
  const TileScheduler<kCausal> s(c.m_blocks, c.heads, c.batch, c.group);
  ASSERT_EQ(s.num_tiles, c.m_blocks * c.heads * c.batch);
  std::set<std::tuple<int, int, int>> seen;
  for (int t = 0; s.valid(t); ++t) {
    const TileCoord tc = s.coord(t);
    ASSERT_GE(tc.m_block, 0);
    ASSERT_LT(tc.m_block, c.m_blocks);
    ASSERT_GE(tc.head, 0);
    ASSERT_LT(tc.head, c.heads);
    ASSERT_GE(tc.batch, 0);
    ASSERT_LT(tc.batch, c.batch);
    EXPECT_TRUE(seen.insert({tc.m_block, tc.head, tc.batch}).second)
        << "tile " << t << " repeats (" << tc.m_block << ", " << tc.head << ", " << tc.batch << ")";
  }
  EXPECT_EQ(static_cast<int>(seen.size()), s.num_tiles);
  EXPECT_FALSE(s.valid(s.num_tiles));
}

TEST(TileScheduler, EveryTileExactlyOnce) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(testing::Message() << "m_blocks " << c.m_blocks << " heads " << c.heads << " batch " << c.batch
                                    << " group " << c.group);
    expect_each_tile_once<false>(c);
    expect_each_tile_once<true>(c);
  }
}

// Causal: inside a group the query block never grows, so longer tiles come first;
// groups follow one another in (batch, head) order, as many as `group` pairs a group
// make, their sizes at most `group` and within one pair of each other.
TEST(TileScheduler, CausalGroupsGoLongestFirst) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(testing::Message() << "m_blocks " << c.m_blocks << " heads " << c.heads << " batch " << c.batch
                                    << " group " << c.group);
    const TileScheduler<true> s(c.m_blocks, c.heads, c.batch, c.group);
    std::vector<std::set<int>> groups;  // the (batch, head) pairs of each group
    int group_end = 0;                  // the first tile past the current group
    for (int t = 0; s.valid(t); ++t) {
      const TileCoord cur = s.coord(t);
      const int cur_bh = cur.batch * c.heads + cur.head;
      if (t == group_end) {
        EXPECT_EQ(cur.m_block, c.m_blocks - 1) << "a group starts with its longest tiles, tile " << t;
        for (const auto& g : groups) EXPECT_GT(cur_bh, *g.rbegin()) << "groups follow (batch, head) order";
        groups.emplace_back();
        // A group opens with one longest tile per pair (with one query block a head,
        // every tile is a longest one and groups cannot be told apart: one pair each).
        int size = 1;
        while (c.m_blocks > 1 && s.valid(t + size) && s.coord(t + size).m_block == c.m_blocks - 1) ++size;
        group_end = t + size * c.m_blocks;
      } else {
        const TileCoord prev = s.coord(t - 1);
        EXPECT_LE(cur.m_block, prev.m_block) << "tile " << t;
      }
      groups.back().insert(cur_bh);
    }
    if (c.m_blocks == 1) continue;
    const int pairs = c.heads * c.batch;
    EXPECT_EQ(static_cast<int>(groups.size()), (pairs + c.group - 1) / c.group);
    std::size_t smallest = groups.front().size(), largest = smallest;
    for (const auto& g : groups) {
      smallest = std::min(smallest, g.size());
      largest = std::max(largest, g.size());
    }
    EXPECT_LE(largest, static_cast<std::size_t>(c.group));
    EXPECT_LE(largest - smallest, 1u);
  }
}

// Non-causal with one head per group: query blocks fastest, then heads, then batch.
TEST(TileScheduler, NonCausalWalksQueryBlocksFastest) {
  const TileScheduler<false> s(5, 3, 2, 1);
  int t = 0;
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 3; ++h)
      for (int m = 0; m < 5; ++m, ++t) {
        const TileCoord tc = s.coord(t);
        EXPECT_EQ(std::make_tuple(tc.m_block, tc.head, tc.batch), std::make_tuple(m, h, b)) << "tile " << t;
      }
}

FwdParams params(int seqlen, int head_dim, int heads_q, int heads_kv, int batch, int sms = 132) {
  FwdParams p;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = head_dim;
  p.head_dim_v = head_dim;
  p.nheads_q = heads_q;
  p.nheads_kv = heads_kv;
  p.batch = batch;
  p.num_sms = sms;
  return p;
}

// A group holds the heads whose K/V fit in 16 MB (bf16: 4 * seqlen * head_dim bytes per
// KV head; GQA query heads of one KV head count once), and more where that is under
// four grids' worth of tiles, up to block_m / 4 heads beyond what fits; at least one
// grid's worth; never more than the problem; groups of equal size (up to one head).
TEST(TileScheduler, CausalHeadGroupSizes) {
  // hdim 128, 16k: 8 MB per head -> 2 fit, but 4 grids of 128 query blocks want 5 heads;
  // 16 heads in groups of at most 5 -> four groups of 4.
  EXPECT_EQ(causal_heads_per_group(params(16384, 128, 16, 16, 1), 2, 128, 128), 4);
  // hdim 256, 16k: 16 MB per head -> 1 fits, 5 for balance, 8 heads -> two groups of 4.
  EXPECT_EQ(causal_heads_per_group(params(16384, 256, 8, 8, 1), 2, 128, 128), 4);
  // hdim 256 causal 8k: 2 fit, 9 for four grids of 64 query blocks -> two groups of 8.
  EXPECT_EQ(causal_heads_per_group(params(8192, 256, 8, 8, 2), 2, 128, 64), 8);
  // GQA 4:1 at 16k hdim 128: 2 KV heads fit, i.e. 8 query heads, more than balance asks.
  EXPECT_EQ(causal_heads_per_group(params(16384, 128, 16, 4, 1), 2, 128, 128), 8);
  // Short rows: 128 KB per head, 128 heads fit in 16 MB, of 256 (32 heads x 8 batch).
  EXPECT_EQ(causal_heads_per_group(params(512, 64, 32, 32, 8), 2, 192, 3), 128);
  // ... and a group never exceeds the problem: 8 x 4 = 32 heads.
  EXPECT_EQ(causal_heads_per_group(params(512, 64, 8, 8, 4), 2, 192, 3), 32);
  // DRAM cap: hdim 256 at 1k, 16 heads fit (1 MB each); four grids of 8 query blocks
  // would take 66, but block_m 128 allows 32; 128 heads -> four groups of 32.
  EXPECT_EQ(causal_heads_per_group(params(1024, 256, 8, 8, 16), 2, 128, 8), 32);
  // One grid at least: 4 query blocks per head on 132 SMs need 33 heads (the cap is 32);
  // 64 heads split evenly: 32 + 32.
  EXPECT_EQ(causal_heads_per_group(params(65536, 128, 64, 64, 1), 2, 128, 4), 32);
  // Equal groups: 100 heads, groups of up to 32 -> four groups of 25, not 32 + 32 + 32 + 4.
  EXPECT_EQ(causal_heads_per_group(params(1024, 128, 100, 100, 1), 2, 128, 8), 25);
}

// Deterministic causal backward: as many heads as keep Q, dO and the fp32 dQ sums within
// 32 MB, at least one grid's worth of tiles, never more than the problem, split evenly.
TEST(TileScheduler, DeterministicHeadGroupSizes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const auto deterministic = [](double head_bytes, std::int64_t pairs, int sms, int blocks) {
    return fitting_heads_per_group(head_bytes, kDeterministicL2Budget, pairs, sms, blocks);
  };
  // hdim 128 16k: 16 MB a head (8 of Q and dO, 8 of sums) -> 2; 16 heads in groups of 2.
  EXPECT_EQ(deterministic(16 * kMiB, 16, 132, 128), 2);
  // hdim 96 16k: 12 MB a head -> 2 fit.
  EXPECT_EQ(deterministic(12 * kMiB, 16, 132, 128), 2);
  // hdim 64 16k: 8 MB a head -> 4, of 32 heads.
  EXPECT_EQ(deterministic(8 * kMiB, 32, 132, 128), 4);
  // hdim 256 16k: 32 MB a head -> 1; 205 key blocks of 80 fill the grid alone.
  EXPECT_EQ(deterministic(32 * kMiB, 8, 132, 205), 1);
  // One grid at least: 2k at hdim 128 (2 MB a head, 16 fit) has 16 key blocks a head,
  // 9 heads fill 132 SMs; 16 fit is more. At 512 (0.5 MB, 64 fit) of 32 x 16 = 512
  // pairs: eight groups of 64.
  EXPECT_EQ(deterministic(2 * kMiB, 128, 132, 16), 16);
  EXPECT_EQ(deterministic(0.5 * kMiB, 512, 132, 4), 64);
  // A head larger than the budget with few key blocks: one grid's worth, 132 / 4 -> 33,
  // of 40 pairs -> two groups of 20.
  EXPECT_EQ(deterministic(64 * kMiB, 40, 132, 4), 20);
  // Never more than the problem.
  EXPECT_EQ(deterministic(0.5 * kMiB, 3, 132, 4), 3);
}

// The backward's varlen calls without a mask: Q, dO and the fp32 dQ sums of the longest
// sequence within 16 MB, at least one grid's worth of tiles, split evenly.
TEST(TileScheduler, StreamingHeadGroupSizes) {
  const auto streaming = [](int seqlen, int head_dim, std::int64_t pairs, int sms, int block_n) {
    const double head_bytes = 8.0 * seqlen * head_dim;  // bf16 Q and dO, fp32 dQ sums
    return fitting_heads_per_group(head_bytes, kStreamingL2Budget, pairs, sms, (seqlen + block_n - 1) / block_n);
  };
  // 17 sequences of up to 2912 at hdim 128 (16 heads): 2.8 MiB a head, 5 fit; 23 key
  // blocks need 6 heads for a grid; 272 pairs in 46 groups of 6 or 5.
  EXPECT_EQ(streaming(2912, 128, 17 * 16, 132, 128), 6);
  // Ten of 1664: 1.6 MiB a head, 9 fit, 11 fill the grid; 160 pairs in 15 groups.
  EXPECT_EQ(streaming(1664, 128, 10 * 16, 132, 128), 11);
  // 16k at hdim 64 (32 heads): 8 MiB a head, 2 fit, one grid is 2 heads of 128 blocks.
  EXPECT_EQ(streaming(16384, 64, 32, 132, 128), 2);
  // Short sequences: 64 fit, never more than the pairs.
  EXPECT_EQ(streaming(256, 128, 40, 132, 128), 40);
}

// A tile's sequence: a fixed-length call's is the whole call (offset 0, its lengths, its
// batch index into the tensors); a varlen call's comes from cu_seqlens and seqused, in
// tensors of one batch entry of all the packed rows.
TEST(SeqBounds, FixedLengthIsTheCallAndVarlenIsEachSequence) {
  FwdParams p{};
  p.batch = 3;
  p.seqlen_q = 100;
  p.seqlen_k = 200;
  const SeqBounds fixed = seq_bounds(p, 2);
  EXPECT_EQ(std::make_tuple(fixed.offset_q, fixed.offset_k, fixed.seqlen_q, fixed.seqlen_k),
            std::make_tuple(0, 0, 100, 200));
  EXPECT_EQ(tensor_batch(p, 2), 2);
  EXPECT_EQ(std::make_tuple(q_rows(p), k_rows(p), tensor_batches(p)), std::make_tuple(100, 200, 3));
  if (!kVarlenKernels) GTEST_SKIP() << "the kernels carry no varlen path in this build (FA3_GPU_VARLEN off)";

  const int cu_q[] = {0, 5, 5, 133}, cu_k[] = {0, 0, 17, 300};
  const int used_q[] = {4, 0, 128}, used_k[] = {0, 9, 250};
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  p.total_q = 140;
  p.total_k = 301;
  const int want[][4] = {{0, 0, 5, 0}, {5, 0, 0, 17}, {5, 17, 128, 283}};
  for (int b = 0; b < 3; ++b) {
    const SeqBounds s = seq_bounds(p, b);
    EXPECT_EQ(std::make_tuple(s.offset_q, s.offset_k, s.seqlen_q, s.seqlen_k),
              std::make_tuple(want[b][0], want[b][1], want[b][2], want[b][3]))
        << "sequence " << b;
    EXPECT_EQ(tensor_batch(p, b), 0);
  }
  EXPECT_EQ(std::make_tuple(q_rows(p), k_rows(p), tensor_batches(p)), std::make_tuple(140, 301, 1));
  p.seqused_q = used_q;
  p.seqused_k = used_k;
  for (int b = 0; b < 3; ++b) {
    const SeqBounds s = seq_bounds(p, b);
    EXPECT_EQ(std::make_tuple(s.offset_q, s.offset_k, s.seqlen_q, s.seqlen_k),
              std::make_tuple(want[b][0], want[b][1], used_q[b], used_k[b]))
        << "sequence " << b << " with seqused";
  }
}

}  // namespace
}  // namespace fa3::hopper
