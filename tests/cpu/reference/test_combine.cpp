// Combining split partial results (fa3::cpu::combine) against a direct merge in fp64:
// lse = logsumexp of the partial lse, out = their exp-weighted sum; splits whose lse is
// -inf (they saw no key) hold NaN and must not leak; rows whose every lse is -inf give
// out 0 and lse -inf; out in fp32, fp16 and bf16; combining the halves of one call's keys
// gives that call's result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "fa3/cpu.h"
#include "host_tensor.h"

namespace fa3::testing {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Partials {
  std::int64_t splits = 3, rows = 7, nheads = 2, dim = 24;
  HostTensor out_partial, lse_partial;

  explicit Partials(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    out_partial = HostTensor(DType::kFloat32, {splits, rows, nheads, dim});
    lse_partial = HostTensor(DType::kFloat32, {splits, rows, nheads});
    out_partial.fill_normal(rng);
    lse_partial.fill_normal(rng, 4.f);
    // Row 1: one split saw no key; row 4: none did. A split without keys holds NaN.
    for (std::int64_t h = 0; h < nheads; ++h) {
      blank(1, 0, h);
      for (std::int64_t s = 0; s < splits; ++s) blank(4, s, h);
    }
  }

  void blank(std::int64_t row, std::int64_t split, std::int64_t h) {
    lse_partial.set({split, row, h, 0}, kNegInf);
    for (std::int64_t d = 0; d < dim; ++d) out_partial.set({split, row, h, d}, NAN);
  }

  CombineArgs args(HostTensor& out, HostTensor& lse) {
    CombineArgs a;
    a.out_partial = out_partial.view();
    a.lse_partial = lse_partial.view();
    a.out = out.view();
    a.lse = lse.view();
    return a;
  }
};

class CombineTest : public ::testing::TestWithParam<DType> {};

TEST_P(CombineTest, EqualsTheDirectMerge) {
  Partials p(21);
  HostTensor out(GetParam(), {p.rows, p.nheads, p.dim});
  HostTensor lse(DType::kFloat32, {p.rows, p.nheads});
  const Status st = cpu::combine(p.args(out, lse));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const double tol = GetParam() == DType::kFloat32 ? 1e-5 : (GetParam() == DType::kFloat16 ? 2e-3 : 1.6e-2);
  for (std::int64_t r = 0; r < p.rows; ++r) {
    for (std::int64_t h = 0; h < p.nheads; ++h) {
      double sum = 0;
      for (std::int64_t s = 0; s < p.splits; ++s) sum += std::exp(static_cast<double>(p.lse_partial.get({s, r, h, 0})));
      if (sum == 0) {
        EXPECT_EQ(lse.get({r, h, 0, 0}), kNegInf);
        for (std::int64_t d = 0; d < p.dim; ++d) EXPECT_EQ(out.get({r, h, d, 0}), 0.f);
        continue;
      }
      const double want_lse = std::log(sum);
      EXPECT_NEAR(lse.get({r, h, 0, 0}), want_lse, 1e-5);
      for (std::int64_t d = 0; d < p.dim; ++d) {
        double want = 0;
        for (std::int64_t s = 0; s < p.splits; ++s) {
          const double w = std::exp(static_cast<double>(p.lse_partial.get({s, r, h, 0})) - want_lse);
          if (w > 0) want += w * p.out_partial.get({s, r, h, d});
        }
        EXPECT_NEAR(out.get({r, h, d, 0}), want, tol * std::max(1.0, std::fabs(want))) << r << ", " << h << ", " << d;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OutDtypes, CombineTest, ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// The keys of one fixed-length call split in two halves, each run alone, then combined:
// the call's own result (attention over a union of key sets is the lse-weighted merge).
TEST(Combine, HalvesOfTheKeysGiveTheWholeCall) {
  Case c;
  c.seqlen_q = 5;
  c.seqlen_k = 40;
  c.nheads_q = 2;
  c.head_dim = 16;
  Attention whole = make_attention(c, 31);
  ASSERT_TRUE(cpu::forward(whole.args()).is_ok());
  const std::int64_t half = c.seqlen_k / 2;
  HostTensor out_partial(DType::kFloat32, {2, c.seqlen_q, c.nheads_q, c.head_dim});
  HostTensor lse_partial(DType::kFloat32, {2, c.seqlen_q, c.nheads_q});
  for (std::int64_t s = 0; s < 2; ++s) {
    Case hc = c;
    hc.seqlen_k = half;
    Attention part = make_attention(hc, 31);
    for (std::int64_t j = 0; j < half; ++j) {
      for (std::int64_t d = 0; d < c.head_dim; ++d) {
        part.k.set({0, j, 0, d}, whole.k.get({0, s * half + j, 0, d}));
        part.v.set({0, j, 0, d}, whole.v.get({0, s * half + j, 0, d}));
      }
    }
    part.q = whole.q;
    ASSERT_TRUE(cpu::forward(part.args()).is_ok());
    for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
      for (std::int64_t h = 0; h < c.nheads_q; ++h) {
        lse_partial.set({s, i, h, 0}, part.lse.get({0, h, i, 0}));
        for (std::int64_t d = 0; d < c.head_dim; ++d) out_partial.set({s, i, h, d}, part.out.get({0, i, h, d}));
      }
    }
  }
  HostTensor out(DType::kFloat32, {c.seqlen_q, c.nheads_q, c.head_dim});
  HostTensor lse(DType::kFloat32, {c.seqlen_q, c.nheads_q});
  CombineArgs a;
  a.out_partial = out_partial.view();
  a.lse_partial = lse_partial.view();
  a.out = out.view();
  a.lse = lse.view();
  ASSERT_TRUE(cpu::combine(a).is_ok());
  for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
    for (std::int64_t h = 0; h < c.nheads_q; ++h) {
      EXPECT_NEAR(lse.get({i, h, 0, 0}), whole.lse.get({0, h, i, 0}), 1e-5);
      for (std::int64_t d = 0; d < c.head_dim; ++d) {
        EXPECT_NEAR(out.get({i, h, d, 0}), whole.out.get({0, i, h, d}), 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace fa3::testing
