// fa3::cpu::forward and fa3::cpu::backward: results, written outputs, and that a
// rejected call leaves its outputs alone.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "fa3/cpu.h"
#include "host_tensor.h"
#include "reference/naive.h"

namespace fa3::testing {
namespace {

Case api_case() {
  Case c;
  c.batch = 2;
  c.seqlen_q = 129;
  c.seqlen_k = 239;
  c.nheads_q = 4;
  c.nheads_kv = 2;
  c.head_dim = 64;
  c.dtype = DType::kBFloat16;
  c.causal = true;
  c.layout = strided_layout();
  c.lse_layout = strided_lse_layout();
  return c;
}

bool all_nan(const HostTensor& t) {
  bool nan = true;
  t.for_each([&](const Index& i, std::int64_t) { nan = nan && std::isnan(t.get(i)); });
  return nan;
}

TEST(CpuEntryForward, MatchesTheExactReference) {
  Case plain = api_case();
  Case capped = api_case();
  capped.causal = false;
  capped.window_left = 30;
  capped.window_right = 5;
  capped.softcap = 1.f;
  capped.dtype = DType::kFloat16;
  Case sunk = api_case();
  sunk.sinks_stddev = 3.f;
  Case deepseek = api_case();  // DeepSeek-V3's prefill head dims
  deepseek.head_dim = 192;
  deepseek.head_dim_v = 128;
  Case wide_v = api_case();
  wide_v.head_dim_v = 512;
  wide_v.dtype = DType::kFloat32;
  for (const Case& c : {plain, capped, sunk, deepseek, wide_v}) {
    SCOPED_TRACE(c.name());
    Attention a = make_attention(c, 800);
    const Status st = cpu::forward(a.args());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const reference::ForwardResult ref =
        reference::forward(a.problem, a.q.view(), a.k.view(), a.v.view(), reference::Precision::kExact, a.sinks_view());
    expect_close("out", a.out, ref.out, kFp32OutTolerance * max_abs(a.v.values()), storage_rounding(c.dtype));
    expect_close("lse", a.lse, ref.lse, kFp32LseTolerance, kFp32LseTolerance);
    EXPECT_TRUE(a.out.padding_is_nan());
    EXPECT_TRUE(a.lse.padding_is_nan());
  }
}

TEST(CpuEntryForward, ThreadCountDoesNotChangeTheResult) {
  Attention a = make_attention(api_case(), 801);
  ASSERT_TRUE(cpu::forward(a.args(), {1}).is_ok());
  const std::vector<double> out = a.out.values();
  const std::vector<double> lse = a.lse.values();
  a.out.fill_nan();
  a.lse.fill_nan();
  ASSERT_TRUE(cpu::forward(a.args(), {0}).is_ok());
  EXPECT_EQ(a.out.values(), out);
  EXPECT_EQ(a.lse.values(), lse);
}

TEST(CpuEntryForward, RejectedCallsLeaveOutputsUntouched) {
  {
    Case c = api_case();
    Attention a = make_attention(c, 802);
    ForwardArgs args = a.args();
    args.k.shape[3] = 32;  // head dim mismatch with q
    const Status st = cpu::forward(args);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("head dim"), std::string::npos) << st.message();
    EXPECT_TRUE(all_nan(a.out));
    EXPECT_TRUE(all_nan(a.lse));
  }
  {
    Attention a = make_attention(api_case(), 803);
    const Status st = cpu::forward(a.args(), {-1});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("num_threads"), std::string::npos) << st.message();
    EXPECT_TRUE(all_nan(a.out));
    EXPECT_TRUE(all_nan(a.lse));
  }
}

// Gradients, with their buffers, for one case; dsinks is asked for when the case has sinks.
struct Gradients {
  HostTensor dout, dq, dk, dv, dsinks;

  explicit Gradients(const Case& c) {
    dout = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.nheads_q, c.value_dim()}, c.layout);
    dq = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.nheads_q, c.head_dim}, c.layout);
    dk = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.nheads_kv, c.head_dim}, c.layout);
    dv = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.nheads_kv, c.value_dim()}, c.layout);
    dsinks = HostTensor(DType::kFloat32, {c.nheads_q});
    std::mt19937_64 rng(804);
    dout.fill_normal(rng);
    dq.fill_nan();
    dk.fill_nan();
    dv.fill_nan();
    dsinks.fill_nan();
  }

  BackwardArgs args(Attention& a) {
    BackwardArgs b;
    b.q = a.q.view();
    b.k = a.k.view();
    b.v = a.v.view();
    b.out = a.out.view();
    b.lse = a.lse.view();
    b.dout = dout.view();
    b.dq = dq.view();
    b.dk = dk.view();
    b.dv = dv.view();
    b.sinks = a.sinks_view();
    if (a.has_sinks) b.dsinks = dsinks.view();
    b.options = a.options;
    return b;
  }
};

// The exact gradients, stored in the caller's dtype and strides: each element is
// the reference value rounded once to bf16; with a V head dim of q's, and of its own
// (dv then has v's).
class CpuEntryBackwardHeadDims : public ::testing::TestWithParam<std::pair<std::int64_t, std::int64_t>> {};
TEST_P(CpuEntryBackwardHeadDims, WritesTheExactGradients) {
  Case c = api_case();
  c.head_dim = GetParam().first;
  c.head_dim_v = GetParam().second;
  Attention a = make_attention(c, 805);
  ASSERT_TRUE(cpu::forward(a.args()).is_ok());
  Gradients g(c);
  const Status st = cpu::backward(g.args(a));
  ASSERT_TRUE(st.is_ok()) << st.to_string();

  const reference::BackwardResult ref =
      reference::backward(a.problem, a.q.view(), a.k.view(), a.v.view(), g.dout.view());
  const std::pair<const HostTensor*, const std::vector<double>*> outputs[] = {
      {&g.dq, &ref.dq}, {&g.dk, &ref.dk}, {&g.dv, &ref.dv}};
  for (const auto& [got, want] : outputs) {
    got->for_each([&](const Index& i, std::int64_t n) {
      const float expected = numeric::round_to(c.dtype, static_cast<float>((*want)[static_cast<std::size_t>(n)]));
      ASSERT_EQ(got->get(i), expected);
    });
    EXPECT_TRUE(got->padding_is_nan());
  }
}
INSTANTIATE_TEST_SUITE_P(HeadDims, CpuEntryBackwardHeadDims,
                         ::testing::Values(std::make_pair(64, 0), std::make_pair(192, 128), std::make_pair(64, 256),
                                           std::make_pair(40, 24)),
                         [](const auto& info) {
                           return "d" + std::to_string(info.param.first) + "_dv" +
                                  std::to_string(info.param.second > 0 ? info.param.second : info.param.first);
                         });

// With sinks: the gradients as above, and dsinks the reference's, rounded once to fp32.
TEST(CpuEntryBackward, WritesTheExactGradientsOfSinks) {
  Case c = api_case();
  c.sinks_stddev = 3.f;
  Attention a = make_attention(c, 807);
  ASSERT_TRUE(cpu::forward(a.args()).is_ok());
  Gradients g(c);
  const Status st = cpu::backward(g.args(a));
  ASSERT_TRUE(st.is_ok()) << st.to_string();

  const reference::BackwardResult ref = reference::backward(
      a.problem, a.q.view(), a.k.view(), a.v.view(), g.dout.view(), reference::Precision::kExact, a.sinks_view());
  const std::pair<const HostTensor*, const std::vector<double>*> outputs[] = {
      {&g.dq, &ref.dq}, {&g.dk, &ref.dk}, {&g.dv, &ref.dv}};
  for (const auto& [got, want] : outputs) {
    got->for_each([&](const Index& i, std::int64_t n) {
      ASSERT_EQ(got->get(i), numeric::round_to(c.dtype, static_cast<float>((*want)[static_cast<std::size_t>(n)])));
    });
  }
  ASSERT_EQ(ref.dsinks.size(), static_cast<std::size_t>(c.nheads_q));
  g.dsinks.for_each([&](const Index& i, std::int64_t n) {
    ASSERT_EQ(g.dsinks.get(i), static_cast<float>(ref.dsinks[static_cast<std::size_t>(n)]));
  });
}

TEST(CpuEntryBackward, RejectedCallsLeaveOutputsUntouched) {
  Case c = api_case();
  Attention a = make_attention(c, 806);
  Gradients g(c);
  BackwardArgs args = g.args(a);
  args.dk.shape[1] = c.seqlen_k + 1;  // dk's shape must equal k's
  const Status st = cpu::backward(args);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("dk"), std::string::npos) << st.message();
  EXPECT_TRUE(all_nan(g.dq));
  EXPECT_TRUE(all_nan(g.dk));
  EXPECT_TRUE(all_nan(g.dv));
}

}  // namespace
}  // namespace fa3::testing
