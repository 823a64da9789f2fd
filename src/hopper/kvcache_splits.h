// fa3 — how many splits of the keys a KV-cache call takes when the caller leaves it to
// fa3 (num_splits 0), and how many of its CTAs an SM holds at once. Plain C++: the host
// plan uses it, the host tests check it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hopper/kvcache_config.h"

namespace fa3::hopper {

// What a CTA costs beside its key blocks, in key blocks' time: its Q, the pipeline's
// first latency, the epilogue, and with splits the merge's share. About two blocks at
// the decode rates measured (a 64-key block of head dim 128 takes about 2 us per CTA at
// two CTAs per SM, a CTA's start and end about as much again).
inline constexpr double kKvSplitFixedBlocks = 2.0;

// The split count for `ctas` CTAs (per split) of `key_blocks` key blocks each, `slots`
// CTAs running at once. The CTAs go in waves of `slots`, each CTA over 1/s of the keys,
// so a count s takes about waves(s) * (key_blocks / s + kKvSplitFixedBlocks), waves(s)
// = ceil(ctas * s / slots), plus `launch_blocks` for counts past `free_splits`: where one
// split leaves a partial wave (320 CTAs on 264 slots), more splits that fill whole waves
// win, and where CTAs fill the slots already, splitting only adds the fixed costs. The
// smallest best count wins; never more than key_blocks (a split of no block is wasted)
// nor than the merge takes.
inline int kvcache_best_splits(std::int64_t ctas, std::int64_t key_blocks, std::int64_t slots, int free_splits,
                               double launch_blocks) {
  const std::int64_t most = std::max<std::int64_t>(1, std::min<std::int64_t>(key_blocks, kMaxKvSplits));
  if (ctas <= 0 || slots <= 0) return 1;
  int best = 1;
  double best_cost = 0;
  for (std::int64_t s = 1; s <= most; ++s) {
    const std::int64_t waves = (ctas * s + slots - 1) / slots;
    const double cost = static_cast<double>(waves) * (static_cast<double>(key_blocks) / s + kKvSplitFixedBlocks) +
                        (s > free_splits ? launch_blocks : 0.0);
    if (s == 1 || cost < best_cost) {
      best = static_cast<int>(s);
      best_cost = cost;
    }
  }
  return best;
}

// The default count, the merge kernel's share in kKvSplitFixedBlocks.
inline int kvcache_default_splits(std::int64_t ctas, std::int64_t key_blocks, std::int64_t slots) {
  return kvcache_best_splits(ctas, key_blocks, slots, kMaxKvSplits, 0.0);
}

// With the splits merged inside the kernel (kKvClusterMerge), counts up to
// kMaxKvClusterSplits need no merge launch after the kernel and larger ones do, which
// costs about kKvMergeLaunchBlocks more (a graph-replayed merge of a small decode step
// took 3-5 us, about two blocks' time).
inline constexpr double kKvMergeLaunchBlocks = 2.0;

inline int kvcache_cluster_splits(std::int64_t ctas, std::int64_t key_blocks, std::int64_t slots) {
  return kvcache_best_splits(ctas, key_blocks, slots, kMaxKvClusterSplits, kKvMergeLaunchBlocks);
}

// Shared memory of one CTA of the kernel family (padded head dims 64, 128 or 256, an
// e4m3 cache with fp8) and tile height (16 or 64), as hopper/kvcache_config.h lays it
// out; 0 for another size.
inline std::size_t kvcache_smem_bytes(int head_dim, int head_dim_v, int block_m, bool fp8 = false) {
  auto of = [&](auto hd, auto hdv) -> std::size_t {
    constexpr int kD = decltype(hd)::value, kDv = decltype(hdv)::value;
    if (fp8) {
      return block_m == 16 ? KvCacheTile<kD, kDv, 16, true>::kSmemBytes : KvCacheTile<kD, kDv, 64, true>::kSmemBytes;
    }
    return block_m == 16 ? KvCacheTile<kD, kDv, 16>::kSmemBytes : KvCacheTile<kD, kDv, 64>::kSmemBytes;
  };
  auto by_v = [&](auto hd) -> std::size_t {
    switch (head_dim_v) {
      case 64: return of(hd, std::integral_constant<int, 64>{});
      case 128: return of(hd, std::integral_constant<int, 128>{});
      case 256: return of(hd, std::integral_constant<int, 256>{});
      default: return 0;
    }
  };
  switch (head_dim) {
    case 64: return by_v(std::integral_constant<int, 64>{});
    case 128: return by_v(std::integral_constant<int, 128>{});
    case 256: return by_v(std::integral_constant<int, 256>{});
    default: return 0;
  }
}

// CTAs of `smem_bytes` an SM holds at once: Hopper's 228 KiB of shared memory, 1 KiB of
// it reserved per CTA, and at most 16 CTAs of 128 threads. The kernels' registers
// (ptxas: 88 to 224 per thread) allow at least as many in every family.
inline int kvcache_ctas_per_sm(std::size_t smem_bytes) {
  constexpr std::size_t kSmemPerSm = 228 * 1024, kReservedPerCta = 1024;
  const std::size_t fit = kSmemPerSm / (smem_bytes + kReservedPerCta);
  return static_cast<int>(std::clamp<std::size_t>(fit, 1, 16));
}

}  // namespace fa3::hopper
