// Which keys a KV-cache CTA reads (hopper/kvcache_keys.h): each row's keys equal
// fa3::Problem's definition for a sequence of those lengths, over windows, causal,
// chunks and both orders of seqlen_q and seqlen_k; and the splits of a tile's key blocks
// are disjoint, in order, and together exactly the blocks holding the tile's keys,
// whatever the number of splits. And the plan refuses head dims whose rows are not whole
// 16-byte units, which the kernel's row copies need.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "api/problem.h"
#include "hopper/kvcache.h"
#include "hopper/kvcache_keys.h"

namespace fa3::hopper {
namespace {

struct MaskCase {
  int left, right, chunk;
};

TEST(KvCacheKeys, RowsSeeTheKeysProblemDefines) {
  const std::vector<MaskCase> masks = {{-1, -1, 0}, {-1, 0, 0}, {6, 1, 0},  {0, 0, 0},
                                       {40, 0, 0},  {-1, -1, 8}, {-1, 0, 8}, {5, 0, 7}};
  for (int seqlen_q : {1, 2, 5, 17, 128}) {
    for (int seqlen_k : {0, 1, 3, 64, 65, 333}) {
      for (const MaskCase& m : masks) {
        Problem p;
        p.seqlen_q = seqlen_q;
        p.seqlen_k = seqlen_k;
        p.window_left = m.left;
        p.window_right = m.right;
        p.chunk = m.chunk;
        const SequenceMask mask{seqlen_q, seqlen_k, m.left, m.right, m.chunk};
        for (int i = 0; i < seqlen_q; ++i) {
          ASSERT_EQ(mask.first_key(i), p.first_key(i))
              << "row " << i << " of (" << seqlen_q << ", " << seqlen_k << "), window (" << m.left << ", "
              << m.right << "), chunk " << m.chunk;
          ASSERT_EQ(mask.last_key(i), p.last_key(i))
              << "row " << i << " of (" << seqlen_q << ", " << seqlen_k << "), window (" << m.left << ", "
              << m.right << "), chunk " << m.chunk;
        }
      }
    }
  }
}

TEST(KvCacheKeys, SplitsCoverTheTileBlocksOnceInOrder) {
  constexpr int kBlockN = 64;
  for (int key_begin : {0, 5, 64, 130}) {
    for (int key_end : {0, 1, 64, 65, 200, 1000}) {
      const int want_first = key_end > key_begin ? key_begin / kBlockN : 0;
      const int want_end = key_end > key_begin ? (key_end + kBlockN - 1) / kBlockN : 0;
      for (int splits : {1, 2, 3, 7, 16, 128}) {
        int next = want_first;
        for (int s = 0; s < splits; ++s) {
          int first = 0;
          const int count = split_blocks(key_begin, key_end, kBlockN, splits, s, &first);
          ASSERT_GE(count, 0);
          if (count == 0) continue;
          EXPECT_EQ(first, next) << "split " << s << " of " << splits;
          next = first + count;
        }
        EXPECT_EQ(next, want_end) << "keys [" << key_begin << ", " << key_end << ") in " << splits << " splits";
      }
    }
  }
}

TEST(KvCachePlan, HeadDimsMustBeWholeSixteenByteUnits) {
  for (const auto& [d, dv] : {std::pair{100, 128}, std::pair{128, 36}, std::pair{7, 7}}) {
    KvCacheProblem kp;
    kp.attention.batch = 2;
    kp.attention.seqlen_q = 1;
    kp.attention.seqlen_k = 64;
    kp.attention.nheads_q = 8;
    kp.attention.nheads_kv = 2;
    kp.attention.head_dim = d;
    kp.attention.head_dim_v = dv;
    kp.capacity = 64;
    KvCachePlan plan;
    const Status s = plan_kvcache(kp, DType::kBFloat16, 0, 132, &plan);
    EXPECT_EQ(s.code(), StatusCode::kNotSupported);
    EXPECT_EQ(s.message(), "k_cache: head dims " + std::to_string(d) + " (q, k) and " + std::to_string(dv) +
                               " (v) must be multiples of 8 for the GPU's KV-cache kernel, which copies whole rows "
                               "in 16-byte units");
  }
}

}  // namespace
}  // namespace fa3::hopper
