// fa3 — the KV-cache kernel's tile: named sizes shared by the kernel and its host code.
//
// One CTA of four warps takes the query rows of one KV head (packed GQA: seqlen_q x
// group rows, row i * group + j being query i of head hkv * group + j) and one split of
// the keys. A tile of 64 rows gives each warp 16 rows and every key of a block; a tile
// of 16 rows (a decode step: 1 token times a group of up to 16 heads) gives all four
// warps the same rows and each a quarter of the block's keys, their results merged in
// shared memory at the end, so that no warp computes rows that do not exist.
#pragma once

#include <cstddef>

namespace fa3::hopper {

// With kFp8 the cache holds e4m3 codes: its rows arrive by the same bulk copies, a byte
// a value, into stages of their own, and each block is converted to fp16 in one staging
// tile (of a 16-bit stage's layout) that the GEMMs read as they read a 16-bit stage.
template <int kHeadDim, int kHeadDimV, int kBlockM, bool kFp8 = false>
struct KvCacheTile {
  static_assert(kBlockM == 16 || kBlockM == 64);
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0, "rows of whole 128-byte swizzle units");
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kBlockN = 64;  // keys per pipeline stage
  static constexpr int kRowWarps = kBlockM / 16;
  static constexpr int kKeyWarps = kWarps / kRowWarps;
  static constexpr int kWarpN = kBlockN / kKeyWarps;  // keys of a block each warp scores
  static_assert(kWarpN % 16 == 0);
  static constexpr std::size_t kElement = 2;  // bf16 or fp16
  static constexpr std::size_t kQBytes = kBlockM * kHeadDim * kElement;
  // A stage's K and V rows arrive whole, one bulk copy each, so they cannot be swizzled:
  // each row is padded by 16 bytes instead, which puts the 8 rows of an ldmatrix
  // matrix 4 banks apart (conflict-free) and keeps every row 16-byte aligned.
  static constexpr int kKPitch = kHeadDim + 8;    // elements from one K row to the next
  static constexpr int kVPitch = kHeadDimV + 8;   // and V's
  static constexpr std::size_t kStageBytes = kBlockN * (kKPitch + kVPitch) * kElement;
  // An e4m3 stage: rows of codes padded by 16 bytes (bulk copies land 16-byte aligned).
  static constexpr int kRawKPitch = kHeadDim + 16;  // bytes from one K row to the next
  static constexpr int kRawVPitch = kHeadDimV + 16;
  static constexpr std::size_t kRawStageBytes = kBlockN * (kRawKPitch + kRawVPitch);
  // The bytes one stage of the ring takes: 16-bit rows, or codes (beside one staging tile).
  static constexpr std::size_t kRingStageBytes = kFp8 ? kRawStageBytes : kStageBytes;
  // Three stages in flight where they fit beside one another with room to spare, two
  // for the widest heads (66 KiB a stage at 256/256, 34 KiB of codes).
  static constexpr int kStages = kRingStageBytes > (kFp8 ? 24 : 48) * 1024 ? 2 : 3;
  static constexpr std::size_t kStagingBytes = kFp8 ? kStageBytes : 0;
  // The fp32 result rows, padded by 4 floats so that the 8 rows of an mma fragment's
  // stores fall in distinct banks; they reuse the K/V stages once the keys are done.
  static constexpr int kOutPitch = kHeadDimV + 4;
  static constexpr std::size_t kOutBytes = static_cast<std::size_t>(kBlockM) * kOutPitch * 4;
  static constexpr std::size_t kRingBytes = kStages * kRingStageBytes + kStagingBytes;
  static constexpr std::size_t kKvBytes = kRingBytes > kOutBytes ? kRingBytes : kOutBytes;
  // Per warp of the key split and row: running max and sum; per row: 1/sum.
  static constexpr std::size_t kStatsBytes = (2 * kKeyWarps + 1) * kBlockM * 4;
  // One mbarrier per stage: its bulk copies' bytes have all landed.
  static constexpr std::size_t kBarrierOffset = (kQBytes + kKvBytes + kStatsBytes + 7) / 8 * 8;
  static constexpr std::size_t kSmemBytes = kBarrierOffset + kStages * 8;
};

// The most splits of the keys one call takes (the merge reads one lse per split and row).
constexpr int kMaxKvSplits = 128;

// Whether a call of 2 to kMaxKvClusterSplits splits merges them inside the kernel: the
// splits of a tile run as one cluster of CTAs, which combine their rows through
// distributed shared memory, with no partial results in the workspace and no merge
// kernel after (the build's FA3_KVCACHE_CLUSTER_MERGE, off: measured slower at batch 8, level
// elsewhere, docs/perf-log.md).
#ifdef FA3_KVCACHE_CLUSTER_MERGE
inline constexpr bool kKvClusterMerge = true;
#else
inline constexpr bool kKvClusterMerge = false;
#endif
// The most CTAs a cluster holds on every Hopper part (the portable size).
constexpr int kMaxKvClusterSplits = 8;

}  // namespace fa3::hopper
