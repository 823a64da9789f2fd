// The CPU merge of partial attention results: attention over keys split in parts,
// merged, equals attention over all keys; rows that saw no key stay 0 / -inf; the
// result may overwrite a part; fp16 and bf16 parts are merged in fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/numeric.h"
#include "fa3/cpu.h"

namespace fa3::testing {
namespace {

constexpr std::int64_t kBatch = 2, kSeqQ = 5, kHeads = 3, kDim = 8;
constexpr std::int64_t kOutElems = kBatch * kSeqQ * kHeads * kDim, kLseElems = kBatch * kHeads * kSeqQ;

std::vector<float> normal(std::int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

TensorView out_view(std::vector<float>& v) {
  return TensorView::contiguous(v.data(), DType::kFloat32, {kBatch, kSeqQ, kHeads, kDim});
}
TensorView lse_view(std::vector<float>& v) {
  return TensorView::contiguous(v.data(), DType::kFloat32, {kBatch, kHeads, kSeqQ});
}

// fp32 attention of q over keys [begin, end) of k and v (seqlen 12).
void attend(std::vector<float>& q, std::vector<float>& k, std::vector<float>& v, std::int64_t begin,
            std::int64_t end, std::vector<float>& out, std::vector<float>& lse) {
  constexpr std::int64_t kSeqK = 12;
  ForwardArgs a;
  a.q = out_view(q);
  a.k = TensorView::strided(k.data() + begin * kHeads * kDim, DType::kFloat32, {kBatch, end - begin, kHeads, kDim},
                            {kSeqK * kHeads * kDim, kHeads * kDim, kDim, 1});
  a.v = a.k;
  a.v.data = v.data() + begin * kHeads * kDim;
  out.assign(kOutElems, NAN);
  lse.assign(kLseElems, NAN);
  a.out = out_view(out);
  a.lse = lse_view(lse);
  ASSERT_TRUE(cpu::forward(a).is_ok());
}

TEST(Merge, PartsOfTheKeysMergeToAttentionOverAllOfThem) {
  std::vector<float> q = normal(kOutElems, 1), k = normal(kBatch * 12 * kHeads * kDim, 2),
                     v = normal(kBatch * 12 * kHeads * kDim, 3);
  std::vector<float> full_out, full_lse, out0, lse0, out1, lse1, out2, lse2;
  attend(q, k, v, 0, 12, full_out, full_lse);
  attend(q, k, v, 0, 3, out0, lse0);
  attend(q, k, v, 3, 4, out1, lse1);
  attend(q, k, v, 4, 12, out2, lse2);
  std::vector<float> out(kOutElems, NAN), lse(kLseElems, NAN);
  MergeArgs m{{out_view(out0), out_view(out1), out_view(out2)},
              {lse_view(lse0), lse_view(lse1), lse_view(lse2)},
              out_view(out),
              lse_view(lse)};
  ASSERT_TRUE(cpu::merge_attention_states(m).is_ok());
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], full_out[i], 2e-6f) << i;
  for (std::size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], full_lse[i], 2e-6f) << i;
}

TEST(Merge, RowsThatSawNoKeyGiveZeroAndNegativeInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> out_a(kOutElems, 0.f), out_b = normal(kOutElems, 4), lse_a(kLseElems, -inf),
                     lse_b(kLseElems, -inf);
  // Row (b 0, h 1, s 2) saw keys in part b only; every other row saw none anywhere.
  lse_b[1 * kSeqQ + 2] = 0.5f;
  std::vector<float> out(kOutElems, NAN), lse(kLseElems, NAN);
  MergeArgs m{{out_view(out_a), out_view(out_b)}, {lse_view(lse_a), lse_view(lse_b)}, out_view(out), lse_view(lse)};
  ASSERT_TRUE(cpu::merge_attention_states(m).is_ok());
  for (std::int64_t i = 0; i < kLseElems; ++i) {
    if (i == 1 * kSeqQ + 2) {
      EXPECT_EQ(lse[i], 0.5f);
    } else {
      EXPECT_EQ(lse[i], -inf) << i;
    }
  }
  for (std::int64_t s = 0; s < kSeqQ; ++s) {
    for (std::int64_t h = 0; h < kHeads; ++h) {
      for (std::int64_t d = 0; d < kDim; ++d) {
        const std::int64_t i = ((0 * kSeqQ + s) * kHeads + h) * kDim + d;
        EXPECT_EQ(out[i], s == 2 && h == 1 ? out_b[i] : 0.f) << i;
        EXPECT_EQ(out[i + kSeqQ * kHeads * kDim], 0.f);
      }
    }
  }
}

TEST(Merge, TheResultMayOverwriteAPart) {
  std::vector<float> out_a = normal(kOutElems, 5), out_b = normal(kOutElems, 6), lse_a = normal(kLseElems, 7),
                     lse_b = normal(kLseElems, 8);
  std::vector<float> expected(kOutElems), expected_lse(kLseElems);
  MergeArgs separate{{out_view(out_a), out_view(out_b)}, {lse_view(lse_a), lse_view(lse_b)}, out_view(expected),
                     lse_view(expected_lse)};
  ASSERT_TRUE(cpu::merge_attention_states(separate).is_ok());
  MergeArgs in_place{{out_view(out_a), out_view(out_b)}, {lse_view(lse_a), lse_view(lse_b)}, out_view(out_a),
                     lse_view(lse_a)};
  ASSERT_TRUE(cpu::merge_attention_states(in_place).is_ok());
  EXPECT_EQ(out_a, expected);
  EXPECT_EQ(lse_a, expected_lse);
}

// bf16 parts: weights and sums in fp32, one rounding at the end.
TEST(Merge, HalfPrecisionPartsAreMergedInFp32) {
  std::vector<float> a = normal(kOutElems, 9), b = normal(kOutElems, 10), lse_a = normal(kLseElems, 11),
                     lse_b = normal(kLseElems, 12);
  std::vector<std::uint16_t> a16(kOutElems), b16(kOutElems), out16(kOutElems, 0x7fc0);
  for (std::int64_t i = 0; i < kOutElems; ++i) {
    a16[i] = numeric::float_to_bf16(a[i]);
    b16[i] = numeric::float_to_bf16(b[i]);
  }
  auto bf16_view = [](std::vector<std::uint16_t>& v) {
    return TensorView::contiguous(v.data(), DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDim});
  };
  std::vector<float> lse(kLseElems);
  MergeArgs m{{bf16_view(a16), bf16_view(b16)}, {lse_view(lse_a), lse_view(lse_b)}, bf16_view(out16), lse_view(lse)};
  ASSERT_TRUE(cpu::merge_attention_states(m).is_ok());
  for (std::int64_t b_ = 0; b_ < kBatch; ++b_) {
    for (std::int64_t s = 0; s < kSeqQ; ++s) {
      for (std::int64_t h = 0; h < kHeads; ++h) {
        const std::int64_t r = (b_ * kHeads + h) * kSeqQ + s;
        const double la = lse_a[r], lb = lse_b[r];
        const double l = std::max(la, lb) + std::log1p(std::exp(-std::fabs(la - lb)));
        EXPECT_NEAR(lse[r], l, 1e-6);
        for (std::int64_t d = 0; d < kDim; ++d) {
          const std::int64_t i = ((b_ * kSeqQ + s) * kHeads + h) * kDim + d;
          const double want = std::exp(la - l) * numeric::bf16_to_float(a16[i]) +
                              std::exp(lb - l) * numeric::bf16_to_float(b16[i]);
          EXPECT_EQ(out16[i], numeric::float_to_bf16(static_cast<float>(want))) << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace fa3::testing
