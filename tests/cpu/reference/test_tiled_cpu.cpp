// The tiled online-softmax CPU path against the exact reference, over the shapes
// of TESTING.md, masks, softcap, head groupings, dtypes, layouts and tilings.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "checks.h"
#include "host_tensor.h"
#include "reference/naive.h"
#include "reference/tiled_cpu.h"

namespace fa3::testing {
namespace {

std::uint64_t seed_of(const Case& c) {
  return static_cast<std::uint64_t>(c.seqlen_q * 1000003 + c.seqlen_k * 1009 + c.head_dim * 17 + c.nheads_q +
                                    c.head_dim_v * 7919);
}

TEST(TiledCpu, SeqlensEqual) {
  for (std::int64_t s : {1, 2, 3, 17, 113, 127, 128, 129, 239, 799, 1023, 1024, 1025}) {
    for (bool causal : {false, true}) {
      Case c;
      c.seqlen_q = c.seqlen_k = s;
      c.causal = causal;
      expect_tiled_matches_exact(c, seed_of(c));
    }
  }
}

TEST(TiledCpu, SeqlensDiffer) {
  const std::pair<std::int64_t, std::int64_t> lens[] = {
      {1, 1025}, {1025, 1}, {1, 128}, {128, 1}, {2, 3}, {3, 2}, {17, 239}, {239, 17},
      {113, 799}, {799, 113}, {127, 1024}, {1023, 129}, {129, 128}, {128, 129}};
  for (const auto& [sq, sk] : lens) {
    for (bool causal : {false, true}) {
      Case c;
      c.seqlen_q = sq;
      c.seqlen_k = sk;
      c.nheads_q = c.nheads_kv = 2;
      c.causal = causal;
      expect_tiled_matches_exact(c, seed_of(c));
    }
  }
}

TEST(TiledCpu, HeadDims) {
  for (std::int64_t d : {1, 8, 33, 40, 64, 96, 128, 192, 256}) {
    Case c;
    c.seqlen_q = 129;
    c.seqlen_k = 113;
    c.head_dim = d;
    c.nheads_q = c.nheads_kv = 2;
    expect_tiled_matches_exact(c, seed_of(c));
    c.causal = true;
    expect_tiled_matches_exact(c, seed_of(c) + 1);
  }
}

// A V head dim of its own (fa3/attention.h): DeepSeek-V3's (192, 128), FlashAttention-3's
// (64, 256) and (64, 512), and dims no vector width divides, V narrower and wider than q,
// over query and key blocks that end mid-sequence.
TEST(TiledCpu, SeparateHeadDimV) {
  const std::pair<std::int64_t, std::int64_t> dims[] = {{192, 128}, {64, 256}, {64, 512}, {40, 24}, {24, 40}, {1, 33}};
  for (const auto& [d, dv] : dims) {
    for (bool causal : {false, true}) {
      Case c;
      c.batch = 2;
      c.seqlen_q = 113;
      c.seqlen_k = 129;
      c.nheads_q = 4;
      c.nheads_kv = 2;
      c.head_dim = d;
      c.head_dim_v = dv;
      c.causal = causal;
      expect_tiled_matches_exact(c, seed_of(c), {16, 32, 0});
    }
  }
  // With every other feature: a window, softcap, sinks, a chunk, bf16 and strided views.
  Case c;
  c.batch = 2;
  c.seqlen_q = 129;
  c.seqlen_k = 113;
  c.nheads_q = 6;
  c.nheads_kv = 2;
  c.head_dim = 192;
  c.head_dim_v = 128;
  c.dtype = DType::kBFloat16;
  c.window_left = 30;
  c.window_right = 5;
  c.softmax_scale = 0.2f;
  c.softcap = 2.f;
  c.attention_chunk = 48;
  c.sinks_stddev = 2.f;
  c.layout = strided_layout();
  c.lse_layout = strided_lse_layout();
  expect_tiled_matches_exact(c, 71);
}

TEST(TiledCpu, SlidingWindows) {
  const std::pair<int, int> windows[] = {{0, 0}, {16, 0}, {0, 16}, {32, -1}, {-1, 8}, {5, 7}, {100, 100}, {200, 3}};
  const std::pair<std::int64_t, std::int64_t> lens[] = {{239, 239}, {113, 239}, {239, 113}, {3, 129}};
  for (const auto& [left, right] : windows) {
    for (const auto& [sq, sk] : lens) {
      Case c;
      c.seqlen_q = sq;
      c.seqlen_k = sk;
      c.window_left = left;
      c.window_right = right;
      expect_tiled_matches_exact(c, seed_of(c) + static_cast<std::uint64_t>(left * 31 + right));
    }
  }
  // A window on a causal mask: causal fixes window_right to 0.
  Case c;
  c.seqlen_q = 799;
  c.seqlen_k = 1023;
  c.causal = true;
  c.window_left = 70;
  expect_tiled_matches_exact(c, 11);
}

TEST(TiledCpu, Softcap) {
  for (float cap : {0.5f, 2.f, 30.f}) {
    for (bool causal : {false, true}) {
      Case c;
      c.seqlen_q = 129;
      c.seqlen_k = 239;
      c.nheads_q = 4;
      c.nheads_kv = 2;
      c.softmax_scale = 0.5f;  // large scores, so the cap bends them
      c.softcap = cap;
      c.causal = causal;
      expect_tiled_matches_exact(c, seed_of(c) + static_cast<std::uint64_t>(cap * 10));
    }
  }
}

// Sinks of a few units against rows of 1 to 239 keys: from a sink that takes almost
// nothing to one that takes most of a row's weight (and, on causal rows that see no key,
// all of it); every query block also rescales for the sink in its last step.
TEST(TiledCpu, Sinks) {
  const std::pair<std::int64_t, std::int64_t> lens[] = {{129, 239}, {239, 17}, {1, 128}};
  const std::pair<std::int64_t, std::int64_t> groups[] = {{4, 4}, {4, 1}};
  for (const auto& [sq, sk] : lens) {
    for (const auto& [hq, hkv] : groups) {
      for (float stddev : {1.f, 5.f}) {
        for (bool causal : {false, true}) {
          Case c;
          c.seqlen_q = sq;
          c.seqlen_k = sk;
          c.nheads_q = hq;
          c.nheads_kv = hkv;
          c.causal = causal;
          c.sinks_stddev = stddev;
          expect_tiled_matches_exact(c, seed_of(c) + static_cast<std::uint64_t>(stddev), {16, 32, 0});
        }
      }
    }
  }
  // With every other feature: a window, softcap, bf16 and strided views.
  Case c;
  c.batch = 2;
  c.seqlen_q = 113;
  c.seqlen_k = 129;
  c.nheads_q = 4;
  c.nheads_kv = 2;
  c.dtype = DType::kBFloat16;
  c.window_left = 20;
  c.window_right = 3;
  c.softmax_scale = 0.5f;
  c.softcap = 2.f;
  c.layout = strided_layout();
  c.lse_layout = strided_lse_layout();
  c.sinks_stddev = 3.f;
  expect_tiled_matches_exact(c, 51);
}

// Sinks are read at their view's stride: a strided view with NaN between the heads'
// values gives bitwise the results of the contiguous one, in the tiled path and the
// reference alike.
TEST(TiledCpu, StridedSinksWithNanBetween) {
  Case c;
  c.seqlen_q = 70;
  c.seqlen_k = 90;
  c.nheads_q = 3;
  c.nheads_kv = 1;
  c.causal = true;
  c.sinks_stddev = 2.f;
  Attention a = make_attention(c, 61);
  reference::tiled_forward(a.problem, a.args());
  const std::vector<double> out = a.out.values();
  const std::vector<double> lse = a.lse.values();
  const reference::ForwardResult ref =
      reference::forward(a.problem, a.q.view(), a.k.view(), a.v.view(), reference::Precision::kExact, a.sinks_view());

  std::vector<float> storage(3 * c.nheads_q, NAN);
  for (std::int64_t h = 0; h < c.nheads_q; ++h) storage[static_cast<std::size_t>(3 * h)] = a.sinks.get({h});
  const TensorView strided = TensorView::strided(storage.data(), DType::kFloat32, {c.nheads_q}, {3});
  ForwardArgs args = a.args();
  args.sinks = strided;
  a.out.fill_nan();
  a.lse.fill_nan();
  reference::tiled_forward(a.problem, args);
  EXPECT_EQ(a.out.values(), out);
  EXPECT_EQ(a.lse.values(), lse);
  const reference::ForwardResult strided_ref =
      reference::forward(a.problem, a.q.view(), a.k.view(), a.v.view(), reference::Precision::kExact, strided);
  EXPECT_EQ(strided_ref.out, ref.out);
  EXPECT_EQ(strided_ref.lse, ref.lse);
}

TEST(TiledCpu, LargeScoresRescaleTheAccumulator) {
  // A scale of 2 (16x the default for head dim 64) makes scores of normal inputs span
  // tens of units: weights differ by e^50, the running max moves many times within
  // each row, and fp32 score errors grow with the scores (hence the wider tolerance).
  Case c;
  c.seqlen_q = 127;
  c.seqlen_k = 1025;
  c.softmax_scale = 2.f;
  expect_tiled_matches_exact(c, 5, {16, 32, 0}, 8);
  c.causal = true;
  expect_tiled_matches_exact(c, 6, {16, 32, 0}, 8);
}

TEST(TiledCpu, HeadGroups) {
  const std::pair<std::int64_t, std::int64_t> groups[] = {{8, 8}, {8, 2}, {8, 1}, {6, 3}};
  for (const auto& [hq, hkv] : groups) {
    for (bool causal : {false, true}) {
      Case c;
      c.batch = 2;
      c.seqlen_q = 113;
      c.seqlen_k = 129;
      c.nheads_q = hq;
      c.nheads_kv = hkv;
      c.head_dim = 40;
      c.causal = causal;
      expect_tiled_matches_exact(c, seed_of(c) + static_cast<std::uint64_t>(hkv));
    }
  }
}

TEST(TiledCpu, Dtypes) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (bool causal : {false, true}) {
      Case c;
      c.batch = 2;
      c.seqlen_q = 239;
      c.seqlen_k = 129;
      c.nheads_q = 4;
      c.nheads_kv = 2;
      c.head_dim = 128;
      c.dtype = dtype;
      c.causal = causal;
      expect_tiled_matches_exact(c, seed_of(c) + static_cast<std::uint64_t>(dtype));
    }
  }
}

TEST(TiledCpu, StridedViewsWithNanPadding) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (bool causal : {false, true}) {
      Case c;
      c.batch = 2;
      c.seqlen_q = 129;
      c.seqlen_k = 239;
      c.nheads_q = 4;
      c.nheads_kv = 2;
      c.head_dim = 96;
      c.dtype = dtype;
      c.causal = causal;
      c.layout = strided_layout();
      c.lse_layout = strided_lse_layout();
      expect_tiled_matches_exact(c, seed_of(c) + static_cast<std::uint64_t>(dtype));
    }
  }
}

TEST(TiledCpu, BlockSizes) {
  const reference::TiledCpuConfig configs[] = {
      {1, 1, 0}, {7, 13, 0}, {16, 64, 0}, {64, 64, 0}, {128, 128, 0}, {128, 32, 0}, {3, 200, 0}, {300, 300, 0}};
  for (const reference::TiledCpuConfig& config : configs) {
    for (bool causal : {false, true}) {
      Case c;
      c.seqlen_q = 239;
      c.seqlen_k = 129;
      c.head_dim = 64;
      c.causal = causal;
      expect_tiled_matches_exact(c, seed_of(c), config);
      c.window_left = 20;
      c.window_right = causal ? -1 : 9;
      expect_tiled_matches_exact(c, seed_of(c) + 1, config);
    }
  }
}

// The padding of strided views holds NaN; results must be bitwise those of compact
// inputs holding the same values.
TEST(TiledCpu, PaddingNeverContributes) {
  Case c;
  c.batch = 2;
  c.seqlen_q = 129;
  c.seqlen_k = 200;
  c.nheads_q = 4;
  c.nheads_kv = 2;
  c.head_dim = 40;
  c.dtype = DType::kBFloat16;
  c.window_left = 50;
  Attention compact = make_attention(c, 21);
  c.layout = strided_layout();
  Attention padded = make_attention(c, 21);
  ASSERT_EQ(compact.q.values(), padded.q.values());
  ASSERT_EQ(compact.v.values(), padded.v.values());

  reference::tiled_forward(compact.problem, compact.args());
  reference::tiled_forward(padded.problem, padded.args());
  EXPECT_EQ(compact.out.values(), padded.out.values());
  EXPECT_EQ(compact.lse.values(), padded.lse.values());
  EXPECT_TRUE(padded.q.padding_is_nan());
  EXPECT_TRUE(padded.out.padding_is_nan());
}

// Each work item is computed alone, in a fixed order, so the thread count and
// repeated runs never change a bit.
TEST(TiledCpu, DeterministicAcrossRunsAndThreadCounts) {
  Case c;
  c.batch = 2;
  c.seqlen_q = 239;
  c.seqlen_k = 239;
  c.nheads_q = 3;
  c.nheads_kv = 1;
  c.causal = true;
  Attention a = make_attention(c, 31);
  reference::tiled_forward(a.problem, a.args(), {64, 64, 1});
  const std::vector<double> out = a.out.values();
  const std::vector<double> lse = a.lse.values();
  for (int threads : {2, 3, 8, 0}) {
    for (int run = 0; run < 3; ++run) {
      a.out.fill_nan();
      a.lse.fill_nan();
      reference::tiled_forward(a.problem, a.args(), {64, 64, threads});
      ASSERT_EQ(a.out.values(), out) << threads << " threads, run " << run;
      ASSERT_EQ(a.lse.values(), lse) << threads << " threads, run " << run;
    }
  }
}

TEST(TiledCpu, LseIsOptional) {
  Case c;
  c.seqlen_q = 65;
  c.seqlen_k = 77;
  c.causal = true;
  Attention a = make_attention(c, 41);
  ForwardArgs args = a.args();
  args.lse.data = nullptr;
  reference::tiled_forward(a.problem, args);
  const reference::ForwardResult ref = reference::forward(a.problem, a.q.view(), a.k.view(), a.v.view());
  expect_close("out", a.out, ref.out, kFp32OutTolerance * max_abs(a.v.values()), 0);
  a.lse.for_each([&](const Index& i, std::int64_t) { EXPECT_TRUE(std::isnan(a.lse.get(i))); });
}

TEST(TiledCpu, RejectsBadConfig) {
  Case c;
  Attention a = make_attention(c, 1);
  EXPECT_THROW(reference::tiled_forward(a.problem, a.args(), {0, 64, 0}), std::invalid_argument);
  EXPECT_THROW(reference::tiled_forward(a.problem, a.args(), {64, 0, 0}), std::invalid_argument);
  EXPECT_THROW(reference::tiled_forward(a.problem, a.args(), {64, 64, -1}), std::invalid_argument);
}

}  // namespace
}  // namespace fa3::testing
