// The reference backward pass: exact gradients (and those of attention sinks) against
// finite differences of the exact forward, masked rows, and the low-precision mode.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "host_tensor.h"
#include "reference/naive.h"

namespace fa3::testing {
namespace {

HostTensor random_dout(const Case& c, std::uint64_t seed) {
  HostTensor dout(c.dtype, {c.batch, c.seqlen_q, c.nheads_q, c.value_dim()}, c.layout);
  std::mt19937_64 rng(seed);
  dout.fill_normal(rng);
  return dout;
}

reference::BackwardResult run_backward(Attention& a, HostTensor& dout,
                                       reference::Precision precision = reference::Precision::kExact) {
  return reference::backward(a.problem, a.q.view(), a.k.view(), a.v.view(), dout.view(), precision, a.sinks_view());
}

// The loss whose gradients backward() returns: sum(out * dout), from the exact forward.
double loss(Attention& a, const HostTensor& dout) {
  const reference::ForwardResult r =
      reference::forward(a.problem, a.q.view(), a.k.view(), a.v.view(), reference::Precision::kExact, a.sinks_view());
  double sum = 0;
  dout.for_each([&](const Index& i, std::int64_t n) { sum += r.out[static_cast<std::size_t>(n)] * dout.get(i); });
  return sum;
}

// Central differences of the loss in every element of `x` (an fp32 input of `a`).
// The step is divided by what was actually stored, so fp32 rounding of x +- h does
// not bias the quotient; the truncation error is ~h^2/6 * |third derivative|.
std::vector<double> finite_differences(Attention& a, HostTensor& x, const HostTensor& dout) {
  constexpr float kStep = 1e-3f;
  std::vector<double> grad;
  x.for_each([&](const Index& i, std::int64_t) {
    const float x0 = x.get(i);
    x.set(i, x0 + kStep);
    const double up_at = x.get(i);
    const double up = loss(a, dout);
    x.set(i, x0 - kStep);
    const double down_at = x.get(i);
    const double down = loss(a, dout);
    x.set(i, x0);
    grad.push_back((up - down) / (up_at - down_at));
  });
  return grad;
}

// Second-order truncation with a step of 1e-3 on O(1) inputs leaves errors near
// 1e-7; fp64 round-off in the loss is ~1e-16 / 1e-3. A wrong term (a missing scale,
// softcap slope or group sum) errs by O(0.1).
constexpr double kFiniteDifferenceTolerance = 1e-5;

void expect_gradients_match_finite_differences(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name());
  Attention a = make_attention(c, seed);
  HostTensor dout = random_dout(c, seed + 1);
  const reference::BackwardResult g = run_backward(a, dout);
  const double scale = 1 + max_abs(g.dq) + max_abs(g.dk) + max_abs(g.dv) + max_abs(g.dsinks);
  EXPECT_LE(max_abs_error(g.dq, finite_differences(a, a.q, dout)), kFiniteDifferenceTolerance * scale);
  EXPECT_LE(max_abs_error(g.dk, finite_differences(a, a.k, dout)), kFiniteDifferenceTolerance * scale);
  EXPECT_LE(max_abs_error(g.dv, finite_differences(a, a.v, dout)), kFiniteDifferenceTolerance * scale);
  EXPECT_GT(max_abs(g.dq), 0);
  EXPECT_GT(max_abs(g.dk), 0);
  EXPECT_GT(max_abs(g.dv), 0);
  ASSERT_EQ(g.dsinks.size(), a.has_sinks ? static_cast<std::size_t>(c.nheads_q) : 0u);
  if (a.has_sinks) {
    EXPECT_LE(max_abs_error(g.dsinks, finite_differences(a, a.sinks, dout)), kFiniteDifferenceTolerance * scale);
    EXPECT_GT(max_abs(g.dsinks), 0);
  }
}

Case small_case(std::int64_t sq, std::int64_t sk, std::int64_t hq, std::int64_t hkv) {
  Case c;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.nheads_q = hq;
  c.nheads_kv = hkv;
  c.head_dim = 8;
  return c;
}

TEST(NaiveBackward, MatchesFiniteDifferences) {
  Case c = small_case(5, 7, 2, 2);
  c.batch = 2;
  expect_gradients_match_finite_differences(c, 100);
}

TEST(NaiveBackward, MatchesFiniteDifferencesCausalWithMaskedRows) {
  Case c = small_case(7, 4, 2, 2);
  c.causal = true;
  expect_gradients_match_finite_differences(c, 200);
}

TEST(NaiveBackward, MatchesFiniteDifferencesGroupedHeads) {
  Case c = small_case(6, 6, 4, 2);
  c.causal = true;
  expect_gradients_match_finite_differences(c, 300);
  c = small_case(5, 8, 3, 1);
  expect_gradients_match_finite_differences(c, 301);
}

TEST(NaiveBackward, MatchesFiniteDifferencesSlidingWindow) {
  Case c = small_case(6, 9, 2, 1);
  c.window_left = 2;
  c.window_right = 1;
  expect_gradients_match_finite_differences(c, 400);
}

TEST(NaiveBackward, MatchesFiniteDifferencesSoftcap) {
  Case c = small_case(6, 6, 4, 2);
  c.softmax_scale = 0.9f;  // scores of a few units, where tanh bends
  c.softcap = 0.7f;
  c.causal = true;
  expect_gradients_match_finite_differences(c, 500);
  c = small_case(9, 6, 2, 1);
  c.softcap = 2.f;
  c.window_left = 3;
  c.window_right = 0;
  expect_gradients_match_finite_differences(c, 501);
}

// A V head dim of its own, narrower and wider than q's: dv is v's shape, dP = dout . v
// runs over v's head dim and dq, dk over q's; with GQA, masks, the softcap and sinks.
TEST(NaiveBackward, MatchesFiniteDifferencesSeparateHeadDimV) {
  Case c = small_case(5, 7, 2, 2);
  c.batch = 2;
  c.head_dim_v = 13;
  expect_gradients_match_finite_differences(c, 120);
  c = small_case(6, 6, 4, 2);
  c.head_dim = 12;
  c.head_dim_v = 5;
  c.causal = true;
  expect_gradients_match_finite_differences(c, 320);
  c = small_case(6, 9, 2, 1);
  c.head_dim_v = 16;
  c.window_left = 2;
  c.window_right = 1;
  c.softmax_scale = 0.9f;
  c.softcap = 1.f;
  c.sinks_stddev = 1.5f;
  expect_gradients_match_finite_differences(c, 420);
}

// Attention is the same on each slice of v's columns, so with v = [v_a | v_b] and dout =
// [dout_a | dout_b] (head dim 32 against q's 16) the loss is the sum of the two halves'
// losses: dq and dk are the sums of theirs (run with equal head dims), and dv is
// [dv_a | dv_b] bit for bit (P and each column of dout alone make a column of dv).
TEST(NaiveBackward, SeparateHeadDimVSumsEqualHeadDimsOnSlicesOfV) {
  Case wide = small_case(20, 27, 4, 2);
  wide.batch = 2;
  wide.head_dim = 16;
  wide.head_dim_v = 32;
  wide.causal = true;
  wide.sinks_stddev = 1.f;
  Case half = wide;
  half.head_dim_v = 0;
  Attention w = make_attention(wide, 630);
  HostTensor dout = random_dout(wide, 631);
  const reference::BackwardResult gw = run_backward(w, dout);
  reference::BackwardResult g[2];
  for (int part = 0; part < 2; ++part) {
    Attention a = make_attention(half, 632);
    a.q.for_each([&](const Index& i, std::int64_t) { a.q.set(i, w.q.get(i)); });
    a.k.for_each([&](const Index& i, std::int64_t) { a.k.set(i, w.k.get(i)); });
    a.v.for_each([&](const Index& i, std::int64_t) { a.v.set(i, w.v.get({i[0], i[1], i[2], i[3] + 16 * part})); });
    a.sinks.for_each([&](const Index& i, std::int64_t) { a.sinks.set(i, w.sinks.get(i)); });
    HostTensor slice = random_dout(half, 633);
    slice.for_each([&](const Index& i, std::int64_t) { slice.set(i, dout.get({i[0], i[1], i[2], i[3] + 16 * part})); });
    g[part] = run_backward(a, slice);
  }
  const double scale = 1 + max_abs(gw.dq) + max_abs(gw.dk);
  std::vector<double> dq(gw.dq.size()), dk(gw.dk.size()), dsinks(gw.dsinks.size());
  for (std::size_t n = 0; n < dq.size(); ++n) dq[n] = g[0].dq[n] + g[1].dq[n];
  for (std::size_t n = 0; n < dk.size(); ++n) dk[n] = g[0].dk[n] + g[1].dk[n];
  for (std::size_t n = 0; n < dsinks.size(); ++n) dsinks[n] = g[0].dsinks[n] + g[1].dsinks[n];
  EXPECT_LE(max_abs_error(gw.dq, dq), 1e-12 * scale);
  EXPECT_LE(max_abs_error(gw.dk, dk), 1e-12 * scale);
  EXPECT_LE(max_abs_error(gw.dsinks, dsinks), 1e-12 * (1 + max_abs(gw.dsinks)));
  ASSERT_EQ(gw.dv.size(), 2 * g[0].dv.size());
  for (std::size_t row = 0; row < g[0].dv.size() / 16; ++row) {
    for (std::size_t d = 0; d < 16; ++d) {
      for (int part = 0; part < 2; ++part) {
        ASSERT_EQ(gw.dv[row * 32 + 16 * part + d], g[part].dv[row * 16 + d]) << "row " << row;
      }
    }
  }
}

// dsinks_h = -sum_i exp(sink_h - lse_i) D_i (fa3/attention.h), against the loss moved by
// each sink. Sinks of a few units take a good share of rows of a few keys, so that a
// wrong term in dq, dk or dv (a P not divided by the sink's share) shows as well.
TEST(NaiveBackward, MatchesFiniteDifferencesWithSinks) {
  Case c = small_case(5, 7, 2, 2);
  c.batch = 2;
  c.sinks_stddev = 1.5f;
  expect_gradients_match_finite_differences(c, 110);
  c = small_case(6, 6, 4, 2);  // GQA: each query head its own sink, dk and dv summed over the group
  c.sinks_stddev = 1.5f;
  expect_gradients_match_finite_differences(c, 310);
  c = small_case(7, 4, 2, 2);  // causal, rows that see no key: lse = sink, D = 0
  c.causal = true;
  c.sinks_stddev = 1.5f;
  expect_gradients_match_finite_differences(c, 210);
  c = small_case(6, 9, 2, 1);
  c.window_left = 2;
  c.window_right = 1;
  c.softmax_scale = 0.9f;
  c.softcap = 1.f;
  c.sinks_stddev = 1.5f;
  expect_gradients_match_finite_differences(c, 410);
}

// Rows that see no key have out 0 whatever q is: their dq is exactly 0, and they add
// nothing (in particular no NaN) to dk and dv.
TEST(NaiveBackward, FullyMaskedRowsContributeNothing) {
  Case c = small_case(20, 5, 2, 1);
  c.batch = 2;
  c.head_dim = 16;
  c.causal = true;
  Attention a = make_attention(c, 600);
  HostTensor dout = random_dout(c, 601);
  for (auto precision : {reference::Precision::kExact, reference::Precision::kLikeInputs}) {
    const reference::BackwardResult g = run_backward(a, dout, precision);
    for (double x : g.dk) ASSERT_TRUE(std::isfinite(x));
    for (double x : g.dv) ASSERT_TRUE(std::isfinite(x));
    a.q.for_each([&](const Index& i, std::int64_t n) {
      const double dq = g.dq[static_cast<std::size_t>(n)];
      if (i[1] < c.seqlen_q - c.seqlen_k) {
        ASSERT_EQ(dq, 0.0);
      } else {
        ASSERT_TRUE(std::isfinite(dq));
      }
    });
  }
}

// With sinks, rows that see no key keep only their sink: out 0, so dq 0 still, and D = 0
// adds nothing to dsinks, in both precisions.
TEST(NaiveBackward, RowsThatSeeOnlyTheirSinkHaveNoGradient) {
  Case c = small_case(20, 5, 2, 1);
  c.batch = 2;
  c.head_dim = 16;
  c.causal = true;
  c.sinks_stddev = 2.f;
  Attention a = make_attention(c, 610);
  HostTensor dout = random_dout(c, 611);
  for (auto precision : {reference::Precision::kExact, reference::Precision::kLikeInputs}) {
    const reference::BackwardResult g = run_backward(a, dout, precision);
    for (double x : g.dk) ASSERT_TRUE(std::isfinite(x));
    for (double x : g.dv) ASSERT_TRUE(std::isfinite(x));
    for (double x : g.dsinks) ASSERT_TRUE(std::isfinite(x));
    a.q.for_each([&](const Index& i, std::int64_t n) {
      const double dq = g.dq[static_cast<std::size_t>(n)];
      if (i[1] < c.seqlen_q - c.seqlen_k) {
        ASSERT_EQ(dq, 0.0);
      } else {
        ASSERT_TRUE(std::isfinite(dq));
      }
    });
  }
}

// Sinks of -inf: dq, dk and dv bitwise those without sinks, dsinks exactly 0.
TEST(NaiveBackward, MinusInfinitySinksAreNoSinks) {
  Case c = small_case(9, 6, 4, 2);
  c.dtype = DType::kBFloat16;
  c.causal = true;
  Attention plain = make_attention(c, 620);
  c.sinks_stddev = 1.f;
  Attention sunk = make_attention(c, 620);
  sunk.sinks.for_each([&](const Index& i, std::int64_t) { sunk.sinks.set(i, -INFINITY); });
  HostTensor dout = random_dout(c, 621);
  for (auto precision : {reference::Precision::kExact, reference::Precision::kLikeInputs}) {
    const reference::BackwardResult want = run_backward(plain, dout, precision);
    const reference::BackwardResult got = run_backward(sunk, dout, precision);
    EXPECT_EQ(got.dq, want.dq);
    EXPECT_EQ(got.dk, want.dk);
    EXPECT_EQ(got.dv, want.dv);
    EXPECT_TRUE(want.dsinks.empty());
    EXPECT_EQ(got.dsinks, std::vector<double>(4, 0.0));
  }
}

// The low-precision mode rounds P, dP and dS to bf16: its gradients differ from the
// exact ones, by a few bf16 units (2^-8 ~ 0.4%) of the gradients' magnitude at most
// (observed: 0.3% to 0.8%).
TEST(NaiveBackward, LikeInputsErrorIsNonzeroAndBounded) {
  Case c = small_case(129, 113, 4, 2);
  c.batch = 2;
  c.head_dim = 64;
  c.dtype = DType::kBFloat16;
  for (bool causal : {false, true}) {
    c.causal = causal;
    c.head_dim_v = causal ? 96 : 0;  // and a V head dim of its own
    SCOPED_TRACE(c.name());
    Attention a = make_attention(c, 700);
    HostTensor dout = random_dout(c, 701);
    const reference::BackwardResult exact = run_backward(a, dout);
    const reference::BackwardResult low = run_backward(a, dout, reference::Precision::kLikeInputs);
    const std::vector<double>* pairs[][2] = {{&low.dq, &exact.dq}, {&low.dk, &exact.dk}, {&low.dv, &exact.dv}};
    for (const auto& pair : pairs) {
      const double err = max_abs_error(*pair[0], *pair[1]);
      EXPECT_GT(err, 0);
      EXPECT_LE(err, 0.02 * max_abs(*pair[1]));
    }
  }
}

// With sinks as well: dq, dk and dv within the same few bf16 units, and dsinks, summed in
// fp32 from the D of the rounded out, too (observed: 0.5 % to 0.8 % of each gradient's
// largest value, dsinks included).
TEST(NaiveBackward, LikeInputsErrorWithSinksIsNonzeroAndBounded) {
  Case c = small_case(129, 113, 4, 2);
  c.batch = 2;
  c.head_dim = 64;
  c.dtype = DType::kBFloat16;
  c.sinks_stddev = 3.f;
  for (bool causal : {false, true}) {
    c.causal = causal;
    SCOPED_TRACE(c.name());
    Attention a = make_attention(c, 710);
    HostTensor dout = random_dout(c, 711);
    const reference::BackwardResult exact = run_backward(a, dout);
    const reference::BackwardResult low = run_backward(a, dout, reference::Precision::kLikeInputs);
    const std::vector<double>* pairs[][2] = {
        {&low.dq, &exact.dq}, {&low.dk, &exact.dk}, {&low.dv, &exact.dv}, {&low.dsinks, &exact.dsinks}};
    for (const auto& pair : pairs) {
      const double err = max_abs_error(*pair[0], *pair[1]);
      EXPECT_GT(err, 0);
      EXPECT_LE(err, 0.02 * max_abs(*pair[1]));
    }
  }
}

}  // namespace
}  // namespace fa3::testing
