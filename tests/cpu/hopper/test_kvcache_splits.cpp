// The KV-cache plan's default split count (hopper/kvcache_splits.h): splits that fill
// whole waves of CTAs where one split leaves a partial one, none where the CTAs fill
// the SMs already, bounded by the key blocks and the merge; and the CTAs an SM holds.
#include <gtest/gtest.h>

#include <cstdint>

#include "hopper/kvcache_config.h"
#include "hopper/kvcache_splits.h"

namespace fa3::hopper {
namespace {

// 132 SMs at two CTAs each (head dim 128, a decode tile).
constexpr std::int64_t kSlots = 264;

// Every count is at least 1 and at most the key blocks and the merge's limit.
void expect_bounded(int (*splits)(std::int64_t, std::int64_t, std::int64_t)) {
  for (std::int64_t ctas : {1, 2, 7, 33, 64, 100, 263, 265, 1000}) {
    for (std::int64_t blocks : {0, 1, 2, 16, 128, 1024, 16384}) {
      const int s = splits(ctas, blocks, kSlots);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, std::max<std::int64_t>(1, blocks));
      EXPECT_LE(s, kMaxKvSplits);
    }
  }
}

TEST(KvCacheSplits, FillWholeWaves) {
  // 8 sequences x 8 KV heads, 8k keys: 4 splits are 256 CTAs, one wave; 5 would spill
  // 56 CTAs into a second.
  EXPECT_EQ(kvcache_default_splits(64, 128, kSlots), 4);
  // 300 CTAs: one split is a wave and a seventh; 7 splits are 2100 CTAs, 8 waves all
  // but full (2112 slots).
  EXPECT_EQ(kvcache_default_splits(300, 128, kSlots), 7);
}

TEST(KvCacheSplits, NoneWhereTheCtasFillTheSlots) {
  EXPECT_EQ(kvcache_default_splits(512, 1024, kSlots), 1);  // 64 x 8, 64k keys: two full waves
  EXPECT_EQ(kvcache_default_splits(264, 16, kSlots), 1);
}

TEST(KvCacheSplits, BoundedByKeyBlocksAndTheMerge) {
  EXPECT_EQ(kvcache_default_splits(1, 1, kSlots), 1);
  EXPECT_EQ(kvcache_default_splits(1, 3, kSlots), 3);
  expect_bounded(kvcache_default_splits);
}

// With the splits merged inside the kernel, counts up to a cluster's size save the merge
// kernel's launch: a short cache's few CTAs stay within one cluster where one more wave
// of splits would have paid for the launch, and a long one still splits past it.
TEST(KvCacheSplits, ClusterMergeKeepsShortCachesInOneCluster) {
  // 1 sequence x 8 KV heads, 1k keys: 16 splits fill one wave (cost 1 + 2), 8 take 2 + 2
  // but no merge launch (+2).
  EXPECT_EQ(kvcache_default_splits(8, 16, kSlots), 16);
  EXPECT_EQ(kvcache_cluster_splits(8, 16, kSlots), kMaxKvClusterSplits);
  // 32k keys: 8 splits leave 64 blocks a CTA; the merge's launch is worth it.
  EXPECT_GT(kvcache_cluster_splits(8, 512, kSlots), kMaxKvClusterSplits);
  EXPECT_EQ(kvcache_cluster_splits(8, 512, kSlots), kvcache_default_splits(8, 512, kSlots));
  // Where the CTAs fill the slots or a few splits already win, the choice is the default's.
  EXPECT_EQ(kvcache_cluster_splits(512, 1024, kSlots), 1);
  EXPECT_EQ(kvcache_cluster_splits(64, 128, kSlots), 4);
  expect_bounded(kvcache_cluster_splits);
}

TEST(KvCacheSplits, CtasPerSmFollowSharedMemory) {
  EXPECT_EQ(kvcache_smem_bytes(128, 128, 16), (KvCacheTile<128, 128, 16>::kSmemBytes));
  EXPECT_EQ(kvcache_smem_bytes(64, 256, 64), (KvCacheTile<64, 256, 64>::kSmemBytes));
  EXPECT_EQ(kvcache_smem_bytes(96, 128, 16), 0u);
  EXPECT_EQ(kvcache_ctas_per_sm(kvcache_smem_bytes(128, 128, 16)), 2);
  EXPECT_EQ(kvcache_ctas_per_sm(kvcache_smem_bytes(256, 256, 16)), 1);
  EXPECT_EQ(kvcache_ctas_per_sm(kvcache_smem_bytes(64, 64, 16)), 3);
  EXPECT_EQ(kvcache_ctas_per_sm(1), 16);
  EXPECT_EQ(kvcache_ctas_per_sm(300 * 1024), 1);
}

// An e4m3 cache's CTA: a ring of codes (half a 16-bit stage's bytes) beside one fp16
// staging tile, within a CTA's shared memory at every head dim.
TEST(KvCacheSplits, Fp8TilesHoldCodesAndOneStagingTile) {
  using Fp8 = KvCacheTile<128, 128, 16, true>;
  using Bf16 = KvCacheTile<128, 128, 16>;
  EXPECT_EQ(kvcache_smem_bytes(128, 128, 16, true), Fp8::kSmemBytes);
  EXPECT_EQ(Fp8::kRingBytes, Fp8::kStages * Fp8::kRawStageBytes + Bf16::kStageBytes);
  EXPECT_EQ(Fp8::kRawStageBytes % 16, 0u);
  EXPECT_EQ((KvCacheTile<256, 256, 64, true>::kStages), 2);
  for (const int d : {64, 128, 256}) {
    for (const int block_m : {16, 64}) EXPECT_LE(kvcache_smem_bytes(d, d, block_m, true), 227u * 1024) << d;
  }
  EXPECT_EQ(kvcache_ctas_per_sm(kvcache_smem_bytes(128, 128, 16, true)), 2);
  EXPECT_GE(kvcache_ctas_per_sm(kvcache_smem_bytes(256, 256, 64, true)), 1);
}

}  // namespace
}  // namespace fa3::hopper
