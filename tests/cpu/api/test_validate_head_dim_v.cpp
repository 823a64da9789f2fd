// A V head dim that differs from q's and k's (fa3/attention.h): the rules on v, out, dout
// and dv broken one at a time from valid (192, 128) arguments on the CPU target, the
// range of v's head dim, the GPU's refusal (after every rule on the arguments), and what
// a valid call resolves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "api/validate.h"
#include "fa3/attention.h"
#include "rule_case.h"
#include "valid_args.h"

namespace fa3::test {
namespace {

const StatusCode kInvalid = StatusCode::kInvalidArgument;
const StatusCode kUnsupported = StatusCode::kNotSupported;

// DeepSeek-V3's prefill: q and k (.., 192), v (2, 96, 2, 128), out and dout (2, 64, 4, 128).
const ArgsShape kSeparate{.head_dim = 192, .head_dim_v = 128};

const std::string kRefusedOnGpu =
    "v: head dim 128 differs from q's head dim 192; a separate V head dim is not implemented on the GPU yet";

// Rules both passes share; each case starts on the CPU target, which takes the arguments.
template <class Args>
std::vector<RuleCase<Args>> shared_cases() {
  auto on = [](auto f) { return on_args<Args>(f); };
  const TargetKind cpu = TargetKind::kCpu;
  return {
      {"out_head_dim_is_q_s", on([](Args& a) { resize_dim(a.out, 3, 192); }), kInvalid,
       "out: shape (2, 64, 4, 192) must be (batch, seqlen_q, nheads_q, head_dim_v) = (2, 64, 4, 128)", cpu},
      {"k_head_dim_is_v_s", on([](Args& a) { resize_dim(a.k, 3, 128); }), kInvalid,
       "k: head dim 128 does not match q's head dim 192", cpu},
      {"v_seqlen_mismatch", on([](Args& a) { resize_dim(a.v, 1, 95); }), kInvalid,
       "v: shape (2, 95, 2, 128) must match k's shape (2, 96, 2, 192) in batch, seqlen and nheads", cpu},
      {"v_head_dim_513", on([](Args& a) { resize_dim(a.v, 3, 513); }), kUnsupported,
       "v: head dim 513 is not supported; supported: 1 to 512", cpu},
      {"refused_on_device", [](Args&, ValidationTarget& t) { t = device_like_target(); }, kUnsupported, kRefusedOnGpu,
       cpu},
      {"refused_on_a_host_target_without_it", [](Args&, ValidationTarget& t) { t.separate_head_dim_v = false; },
       kUnsupported,
       "v: head dim 128 differs from q's head dim 192; a separate V head dim is not implemented on this path yet", cpu},
      // The refusal comes after every rule on the arguments: a call wrong anyway says so.
      {"refused_on_device_after_the_shape_rules",
       [](Args& a, ValidationTarget& t) {
         t = device_like_target();
         resize_dim(a.out, 1, 65);
       },
       kInvalid, "out: shape (2, 65, 4, 128) must be (batch, seqlen_q, nheads_q, head_dim_v) = (2, 64, 4, 128)", cpu},
      {"refused_on_device_after_the_options",
       [](Args& a, ValidationTarget& t) {
         t = device_like_target();
         a.options.window_left = 4;
       },
       kUnsupported, "sliding window (window_left/window_right) is not implemented on this path yet", cpu},
      {"v_head_dim_over_the_target_s_max",
       [](Args& a, ValidationTarget& t) {
         t = device_like_target();
         t.separate_head_dim_v = true;
         resize_dim(a.v, 3, 320);
       },
       kUnsupported, "v: head dim 320 is not supported; supported: 1 to 256", cpu},
      {"v_head_dim_not_whole_16_byte_units_on_device",
       [](Args& a, ValidationTarget& t) {
         t = device_like_target();
         t.separate_head_dim_v = true;
         resize_dim(a.v, 3, 100);
       },
       kUnsupported,
       "v: head dim 100 is not a multiple of 8 (16 bytes), as the GPU needs; pad it with zero columns "
       "(flash_attn_func does)",
       cpu},
  };
}

std::vector<RuleCase<BackwardArgs>> backward_cases() {
  using Args = BackwardArgs;
  const TargetKind cpu = TargetKind::kCpu;
  return {
      {"dout_head_dim_is_q_s", on_args<Args>([](Args& a) { resize_dim(a.dout, 3, 192); }), kInvalid,
       "dout: shape (2, 64, 4, 192) must be (batch, seqlen_q, nheads_q, head_dim_v) = (2, 64, 4, 128)", cpu},
      {"dq_head_dim_is_v_s", on_args<Args>([](Args& a) { resize_dim(a.dq, 3, 128); }), kInvalid,
       "dq: shape (2, 64, 4, 128) must equal q's shape (2, 64, 4, 192)", cpu},
      {"dk_head_dim_is_v_s", on_args<Args>([](Args& a) { resize_dim(a.dk, 3, 128); }), kInvalid,
       "dk: shape (2, 96, 2, 128) must equal k's shape (2, 96, 2, 192)", cpu},
      {"dv_head_dim_is_k_s", on_args<Args>([](Args& a) { resize_dim(a.dv, 3, 192); }), kInvalid,
       "dv: shape (2, 96, 2, 192) must equal v's shape (2, 96, 2, 128)", cpu},
  };
}

class ForwardHeadDimVRule : public ::testing::TestWithParam<RuleCase<ForwardArgs>> {};
TEST_P(ForwardHeadDimVRule, IsRejectedWithItsMessage) {
  ValidArgs valid(kSeparate);
  check_rule<ForwardArgs>(GetParam(), valid.forward(), &validate_forward);
}
INSTANTIATE_TEST_SUITE_P(HeadDimV, ForwardHeadDimVRule, ::testing::ValuesIn(shared_cases<ForwardArgs>()),
                         case_name<ForwardArgs>);

class BackwardHeadDimVRule : public ::testing::TestWithParam<RuleCase<BackwardArgs>> {};
TEST_P(BackwardHeadDimVRule, IsRejectedWithItsMessage) {
  ValidArgs valid(kSeparate);
  check_rule<BackwardArgs>(GetParam(), valid.backward(), &validate_backward);
}
INSTANTIATE_TEST_SUITE_P(HeadDimV, BackwardHeadDimVRule, ::testing::ValuesIn(shared_cases<BackwardArgs>()),
                         case_name<BackwardArgs>);
INSTANTIATE_TEST_SUITE_P(Gradients, BackwardHeadDimVRule, ::testing::ValuesIn(backward_cases()),
                         case_name<BackwardArgs>);

// The pairs of DeepSeek-V3 and FlashAttention-3's other separate V head dims, the range's
// ends, and a V head dim larger than the largest q head dim; the default scale stays
// 1/sqrt of q's head dim.
TEST(ValidateHeadDimV, CpuTargetResolvesEverySeparateHeadDimV) {
  const std::pair<std::int64_t, std::int64_t> dims[] = {{192, 128}, {64, 256}, {64, 512}, {40, 24},
                                                        {1, 512},   {256, 1},  {8, 300}};
  for (const auto& [d, dv] : dims) {
    SCOPED_TRACE("d " + std::to_string(d) + " dv " + std::to_string(dv));
    ValidArgs valid({.seqlen_q = 3, .seqlen_k = 5, .head_dim = d, .head_dim_v = dv});
    Problem f, b;
    const Status fs = validate_forward(valid.forward(), cpu_target(), &f);
    ASSERT_TRUE(fs.is_ok()) << fs.to_string();
    const Status bs = validate_backward(valid.backward(), cpu_target(), &b);
    ASSERT_TRUE(bs.is_ok()) << bs.to_string();
    for (const Problem& p : {f, b}) {
      EXPECT_EQ(p.head_dim, d);
      EXPECT_EQ(p.head_dim_v, dv);
      EXPECT_FLOAT_EQ(p.softmax_scale, 1.f / std::sqrt(static_cast<float>(d)));
    }
  }
}

// Both GPU targets take a separate V head dim (the backward on the kernel of the larger
// head dim); the backward refuses a V head dim past its largest kernel by name.
TEST(ValidateHeadDimV, GpuTargetsTakeASeparateHeadDimV) {
  EXPECT_TRUE(gpu_target().separate_head_dim_v);
  EXPECT_TRUE(gpu_backward_target().separate_head_dim_v);
  ValidArgs valid(kSeparate);
  ValidArgs equal({.head_dim = 128});
  for (ValidationTarget t : {gpu_target(), gpu_backward_target()}) {
    t.locate = nullptr;
    t.backward_workspace = nullptr;
    t.dtypes = {DType::kBFloat16};
    t.head_dims = {128, 192};
    t.max_head_dim_v = 192;
    Problem p;
    const Status f = validate_forward(valid.forward(), t, &p);
    EXPECT_TRUE(f.is_ok()) << f.to_string();
    const Status b = validate_backward(valid.backward(), t, &p);
    EXPECT_TRUE(b.is_ok()) << b.to_string();
    EXPECT_EQ(p.head_dim_v, 128);
    const Status same = validate_backward(equal.backward(), t, &p);
    EXPECT_TRUE(same.is_ok()) << same.to_string();
  }
  ValidationTarget t = gpu_backward_target();
  t.locate = nullptr;
  t.backward_workspace = nullptr;
  t.dtypes = {DType::kBFloat16};
  t.head_dims = {128};
  t.max_head_dim_v = 128;
  ValidArgs wide_v({.head_dim = 64, .head_dim_v = 192});
  Problem p;
  const Status b = validate_backward(wide_v.backward(), t, &p);
  EXPECT_EQ(b.code(), kUnsupported);
  EXPECT_EQ(b.message(), "v: head dim 192 is not supported; supported: 1 to 128");
}

// The forward takes V head dims up to 512 whatever kernels were built (wider than the
// widest kernel's, they run in column slices), and refuses 513 by name.
TEST(ValidateHeadDimV, GpuForwardTakesVHeadDimsUpTo512) {
  ValidationTarget t = gpu_target();
  t.locate = nullptr;
  t.dtypes = {DType::kBFloat16};
  t.head_dims = {64, 128};
  Problem p;
  ValidArgs wide({.head_dim = 64, .head_dim_v = 512});
  const Status ok = validate_forward(wide.forward(), t, &p);
  EXPECT_TRUE(ok.is_ok()) << ok.to_string();
  EXPECT_EQ(p.head_dim_v, 512);
  ValidArgs wider({.head_dim = 64, .head_dim_v = 513});
  const Status refused = validate_forward(wider.forward(), t, &p);
  EXPECT_EQ(refused.code(), kUnsupported);
  EXPECT_EQ(refused.message(), "v: head dim 513 is not supported; supported: 1 to 512");
}

// fa3::backward_workspace_size validates a separate V head dim as backward() does, and
// writes no size when it refuses.
TEST(ValidateHeadDimV, WorkspaceSizeQueryValidatesAsBackwardDoes) {
  ValidArgs valid(kSeparate);
  ValidationTarget t = gpu_backward_target();
  t.locate = nullptr;
  t.backward_workspace = nullptr;
  Problem p;
  const Status want = validate_backward(valid.backward(), t, &p);
  std::size_t bytes = 7;
  const Status got = backward_workspace_size(valid.backward(), &bytes);
  EXPECT_EQ(got.code(), want.code());
  EXPECT_EQ(got.message(), want.message());
  if (!want.is_ok()) EXPECT_EQ(bytes, 7u);
}

}  // namespace
}  // namespace fa3::test
