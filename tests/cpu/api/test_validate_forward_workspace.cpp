// The forward's device workspace (ForwardArgs::workspace): its rules, broken one at a
// time from valid FP8 arguments that carry a workspace of the size the target asks; the
// size asked of the resolved problem; a call that needs none passes without one; the
// workspace is checked after every other rule; and fa3::forward_workspace_size answers
// what the GPU's target then asks (or refuses what it refuses).
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "api/validate.h"
#include "fa3/attention.h"
#include "hopper/fp8_layout.h"
#include "hopper/fp8_vt.h"
#include "hopper/fwd_dispatch.h"
#include "rule_case.h"
#include "valid_args.h"
#include "valid_fp8_args.h"

namespace fa3::test {
namespace {

const StatusCode kInvalid = StatusCode::kInvalidArgument;
using Args = ForwardArgs;
using Case = RuleCase<Args>;

// A device target with FP8 whose forward asks a fixed workspace of e4m3 calls and none
// of the others, so that the rules are testable without a GPU. `refused`, when set, is
// the one pointer its location check calls host memory.
constexpr std::size_t kWorkspaceBytes = 4096;

ValidationTarget workspace_target(const void* refused = nullptr) {
  ValidationTarget t = device_like_target(refused, "host memory");
  t.supports_fp8 = true;
  t.forward_workspace = [](const Problem&, DType dtype) {
    return dtype == DType::kFloat8E4M3 ? kWorkspaceBytes : std::size_t{0};
  };
  return t;
}

std::vector<Case> workspace_cases() {
  return {
      {"workspace_null",
       [](Args& a, ValidationTarget& t) {
         t = workspace_target();
         a.workspace = nullptr;
       },
       kInvalid, "workspace: data pointer is null; this call needs 4096 bytes (fa3::forward_workspace_size)",
       TargetKind::kDeviceWithFp8},
      {"workspace_one_byte_short",
       [](Args& a, ValidationTarget& t) {
         t = workspace_target();
         a.workspace_bytes = kWorkspaceBytes - 1;
       },
       kInvalid, "workspace: 4095 bytes given, 4096 needed (fa3::forward_workspace_size)", TargetKind::kDeviceWithFp8},
      {"workspace_size_0",
       [](Args& a, ValidationTarget& t) {
         t = workspace_target();
         a.workspace_bytes = 0;
       },
       kInvalid, "workspace: 0 bytes given, 4096 needed (fa3::forward_workspace_size)", TargetKind::kDeviceWithFp8},
      {"workspace_not_256_byte_aligned",
       [](Args& a, ValidationTarget& t) {
         t = workspace_target();
         a.workspace = static_cast<std::byte*>(a.workspace) + 64;
       },
       kInvalid, "workspace: data pointer is not 256-byte aligned", TargetKind::kDeviceWithFp8},
      {"workspace_not_device_memory", [](Args& a, ValidationTarget& t) { t = workspace_target(a.workspace); },
       kInvalid, "workspace: pointer is host memory, not memory of the current CUDA device",
       TargetKind::kDeviceWithFp8},
  };
}

// FP8 arguments the GPU's rules accept: without block scales, whose block_rows in
// ValidFp8Args is not the kernels' on purpose.
ForwardArgs fp8_args(const ValidFp8Args& valid) {
  ForwardArgs a = valid.forward();
  a.fp8.q_block_scale = a.fp8.k_block_scale = a.fp8.v_block_scale = TensorView{};
  return a;
}

// fp8_args with a workspace of kWorkspaceBytes.
struct Fp8Call {
  ValidFp8Args valid;
  HostBuffer workspace{kWorkspaceBytes};
  ForwardArgs args;
  Fp8Call() : args(fp8_args(valid)) {
    args.workspace = workspace.data();
    args.workspace_bytes = kWorkspaceBytes;
  }
};

class ForwardWorkspaceRule : public ::testing::TestWithParam<Case> {};
TEST_P(ForwardWorkspaceRule, IsRejectedWithItsMessage) {
  ValidFp8Args valid;
  HostBuffer workspace(2 * kWorkspaceBytes);
  ForwardArgs args = fp8_args(valid);
  args.workspace = workspace.data();
  args.workspace_bytes = kWorkspaceBytes;
  Problem p;
  const Status unbroken = validate_forward(args, workspace_target(), &p);
  ASSERT_TRUE(unbroken.is_ok()) << "the unbroken workspace must pass: " << unbroken.to_string();
  check_rule<Args>(GetParam(), args, &validate_forward);
}
INSTANTIATE_TEST_SUITE_P(Workspace, ForwardWorkspaceRule, ::testing::ValuesIn(workspace_cases()), case_name<Args>);

// A build whose only forward kernels are FP8 ones (no 16-bit dtype listed) runs e4m3
// calls and refuses 16-bit ones as a build without kernels.
TEST(ValidateForwardWorkspace, Fp8KernelsAloneRunFp8Calls) {
  Fp8Call call;
  ForwardArgs& a = call.args;
  ValidationTarget t = workspace_target();
  t.dtypes.clear();
  t.head_dims.clear();
  Problem p;
  const Status s = validate_forward(a, t, &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  const Status refused = validate_forward(ValidArgs().forward(), t, &p);
  EXPECT_EQ(refused.code(), StatusCode::kNotSupported);
  EXPECT_EQ(refused.message(), "no GPU kernels were built into this library");
  t.supports_fp8 = false;
  EXPECT_EQ(validate_forward(a, t, &p).message(), "no GPU kernels were built into this library");
}

// e4m3 calls are held to the FP8 kernels' head dims, which a build may have beside
// 16-bit kernels of others (a head dim 128 e4m3 call, 16-bit kernels at 64 only).
TEST(ValidateForwardWorkspace, Fp8CallsTakeTheFp8KernelsHeadDims) {
  Fp8Call call;
  ForwardArgs& a = call.args;
  ValidationTarget t = workspace_target();
  t.head_dims = {64};
  t.fp8_head_dims = {128, 256};
  Problem p;
  const Status s = validate_forward(a, t, &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  t.fp8_head_dims = {64};
  const Status refused = validate_forward(a, t, &p);
  EXPECT_EQ(refused.code(), StatusCode::kNotSupported);
  EXPECT_EQ(refused.message(), "q: head dim 128 is not supported; supported: 1 to 64 (kernels built for head dims 64)");
}

TEST(ValidateForwardWorkspace, AskedOfTheResolvedProblemAndDtype) {
  Fp8Call call;
  ForwardArgs& a = call.args;
  a.options.causal = true;
  Problem asked;
  DType asked_dtype = DType::kFloat32;
  ValidationTarget t = workspace_target();
  t.forward_workspace = [&](const Problem& p, DType dtype) {
    asked = p;
    asked_dtype = dtype;
    return kWorkspaceBytes;
  };
  Problem p;
  const Status s = validate_forward(a, t, &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(asked_dtype, DType::kFloat8E4M3);
  EXPECT_EQ(asked.batch, 2);
  EXPECT_EQ(asked.seqlen_k, 96);
  EXPECT_EQ(asked.nheads_kv, 2);
  EXPECT_EQ(asked.head_dim_v, 128);
  EXPECT_TRUE(asked.causal);
}

// A call whose workspace is 0 bytes passes with none at all, as every bf16 and fp16
// call does.
TEST(ValidateForwardWorkspace, CallThatNeedsNoneTakesNullptr) {
  ValidArgs valid;
  ForwardArgs a = valid.forward();
  ASSERT_EQ(a.workspace, nullptr);
  Problem p;
  const Status s = validate_forward(a, workspace_target(), &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

// The workspace is the last thing checked: a call broken elsewhere as well is refused
// for that, and a size is never asked of a problem that did not validate.
TEST(ValidateForwardWorkspace, CheckedAfterEveryOtherRule) {
  ValidFp8Args valid;
  ForwardArgs a = fp8_args(valid);
  a.options.softmax_scale = -1.f;
  ValidationTarget t = workspace_target();
  t.forward_workspace = [](const Problem&, DType) -> std::size_t {
    ADD_FAILURE() << "workspace size asked of an invalid problem";
    return kWorkspaceBytes;
  };
  Problem p;
  const Status s = validate_forward(a, t, &p);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_EQ(s.message().rfind("softmax_scale", 0), 0u) << s.message();
}

// The host path has no workspace: a target of host space never asks for one.
TEST(ValidateForwardWorkspace, HostTargetNeedsNone) {
  ValidFp8Args valid;
  ValidationTarget t = cpu_target();
  t.forward_workspace = [](const Problem&, DType) -> std::size_t {
    ADD_FAILURE() << "the host path asked for a workspace";
    return kWorkspaceBytes;
  };
  Problem p;
  const Status s = validate_forward(valid.forward(), t, &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

// ---- fa3::forward_workspace_size ----

// The GPU's own target with host buffers standing in for device memory.
ValidationTarget gpu_target_on_host_buffers() {
  ValidationTarget t = gpu_target();
  t.locate = nullptr;
  return t;
}

// The query answers the size the GPU's target then asks: exactly that much passes, a
// byte less does not; or, where the target refuses the call (a build without its
// kernels), the query refuses it alike and leaves `bytes` alone.
void expect_query_matches_target(ForwardArgs a, std::size_t expected_bytes) {
  Problem p;
  const Status want = validate_forward(a, [] {
    ValidationTarget t = gpu_target_on_host_buffers();
    t.forward_workspace = nullptr;
    return t;
  }(), &p);
  std::size_t bytes = 12345;
  const Status got = forward_workspace_size(a, &bytes);
  if (!want.is_ok()) {
    EXPECT_EQ(got.code(), want.code()) << got.to_string();
    EXPECT_EQ(got.message(), want.message());
    EXPECT_EQ(bytes, 12345u) << "a refused query must leave bytes alone";
    return;
  }
  ASSERT_TRUE(got.is_ok()) << got.to_string();
  EXPECT_EQ(bytes, expected_bytes);
  if (bytes == 0) {
    const Status none = validate_forward(a, gpu_target_on_host_buffers(), &p);
    EXPECT_TRUE(none.is_ok()) << none.to_string();
    return;
  }
  HostBuffer workspace(bytes);
  a.workspace = workspace.data();
  a.workspace_bytes = bytes;
  const Status exact = validate_forward(a, gpu_target_on_host_buffers(), &p);
  EXPECT_TRUE(exact.is_ok()) << exact.to_string();
  a.workspace_bytes = bytes - 1;
  const Status short_by_one = validate_forward(a, gpu_target_on_host_buffers(), &p);
  EXPECT_EQ(short_by_one.message(), "workspace: " + std::to_string(bytes - 1) + " bytes given, " +
                                        std::to_string(bytes) + " needed (fa3::forward_workspace_size)");
}

TEST(ForwardWorkspaceSize, Bf16CallNeedsNone) {
  ValidArgs valid;
  expect_query_matches_target(valid.forward(), 0);
}

// V transposed: batch 2 x 2 KV heads x head dim 128 x 96 keys padded to whole blocks;
// none where the FP8 kernels transpose V in shared memory.
TEST(ForwardWorkspaceSize, Fp8CallNeedsVTransposed) {
  ValidFp8Args valid;
  const std::size_t keys = static_cast<std::size_t>(hopper::fp8_vt_keys(96));
  EXPECT_EQ(keys % hopper::kFp8VtKeyAlign, 0u);
  EXPECT_GE(keys, 96u);
  expect_query_matches_target(fp8_args(valid), hopper::fwd_fp8_vt_in_smem() ? 0 : 2 * 2 * 128 * keys);
}

// A broken call is refused by the query as by the target, whatever the build.
TEST(ForwardWorkspaceSize, RefusesWhatForwardRefuses) {
  ValidFp8Args valid;
  ForwardArgs a = fp8_args(valid);
  resize_dim(a.fp8.k_descale, 1, 3);
  Problem p;
  const Status want = validate_forward(a, gpu_target_on_host_buffers(), &p);
  ASSERT_FALSE(want.is_ok());
  std::size_t bytes = 12345;
  const Status got = forward_workspace_size(a, &bytes);
  EXPECT_EQ(got.code(), want.code()) << got.to_string();
  EXPECT_EQ(got.message(), want.message());
  EXPECT_EQ(bytes, 12345u) << "a refused query must leave bytes alone";
}

// The hopper layer's answer per dtype: Vᵀ for e4m3 (none where the FP8 kernels transpose
// V in shared memory), nothing for the others.
TEST(ForwardWorkspaceSize, OnlyFp8CallsHaveOne) {
  const bool vt_in_smem = hopper::fwd_fp8_vt_in_smem();
  Problem p;
  p.batch = 3;
  p.seqlen_k = 1000;
  p.nheads_kv = 5;
  p.head_dim_v = 64;
  EXPECT_EQ(hopper::fwd_workspace_bytes(p, DType::kBFloat16), 0u);
  EXPECT_EQ(hopper::fwd_workspace_bytes(p, DType::kFloat16), 0u);
  EXPECT_EQ(hopper::fwd_workspace_bytes(p, DType::kFloat8E4M3),
            vt_in_smem ? 0u : 3u * 5u * 64u * static_cast<std::size_t>(hopper::fp8_vt_keys(1000)));
  // A varlen call's sequences share one Vᵀ per KV head (hopper/fp8_vt.h).
  p.varlen = true;
  p.total_k = 2500;
  EXPECT_EQ(hopper::fwd_workspace_bytes(p, DType::kBFloat16), 0u);
  EXPECT_EQ(hopper::fwd_workspace_bytes(p, DType::kFloat8E4M3),
            vt_in_smem ? 0u : 5u * 64u * static_cast<std::size_t>(hopper::fp8_vt_varlen_keys(2500, 3)));
}

}  // namespace
}  // namespace fa3::test
