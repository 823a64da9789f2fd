// validate_backward: the rules on the tensors only the backward pass has (dout, the
// mandatory lse, dq, dk, dv), a sample of the rules it shares with the forward, the
// device workspace's rules, and what a valid call resolves; and that
// fa3::backward_workspace_size validates as backward() does and gives the size it asks
// for. Options are covered in test_validate_options.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "api/validate.h"
#include "fa3/attention.h"
#include "hopper/bwd_dispatch.h"
#include "rule_case.h"
#include "valid_args.h"

namespace fa3::test {
namespace {

using Args = BackwardArgs;
using Case = RuleCase<Args>;

constexpr std::int64_t kOverInt32 = std::int64_t{1} << 31;
const StatusCode kInvalid = StatusCode::kInvalidArgument;
const StatusCode kUnsupported = StatusCode::kNotSupported;

// Shapes as in the forward: q, out, dout, dq (2, 64, 4, 128); k, v, dk, dv (2, 96, 2, 128);
// lse (2, 4, 64); bf16.
std::vector<Case> tensor_cases() {
  return {
      {"q_null", on_args<Args>([](Args& a) { a.q.data = nullptr; }), kInvalid, "q: data pointer is null"},
      {"k_null", on_args<Args>([](Args& a) { a.k.data = nullptr; }), kInvalid, "k: data pointer is null"},
      {"v_null", on_args<Args>([](Args& a) { a.v.data = nullptr; }), kInvalid, "v: data pointer is null"},
      {"out_null", on_args<Args>([](Args& a) { a.out.data = nullptr; }), kInvalid, "out: data pointer is null"},
      {"dout_null", on_args<Args>([](Args& a) { a.dout.data = nullptr; }), kInvalid,
       "dout: data pointer is null"},
      {"lse_null", on_args<Args>([](Args& a) { a.lse.data = nullptr; }), kInvalid, "lse: data pointer is null"},
      {"dq_null", on_args<Args>([](Args& a) { a.dq.data = nullptr; }), kInvalid, "dq: data pointer is null"},
      {"dk_null", on_args<Args>([](Args& a) { a.dk.data = nullptr; }), kInvalid, "dk: data pointer is null"},
      {"dv_null", on_args<Args>([](Args& a) { a.dv.data = nullptr; }), kInvalid, "dv: data pointer is null"},
      {"dout_rank_3", on_args<Args>([](Args& a) { a.dout.rank = 3; }), kInvalid,
       "dout: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank 3"},
      {"lse_rank_2", on_args<Args>([](Args& a) { a.lse.rank = 2; }), kInvalid,
       "lse: expected a 3-d tensor (batch, nheads, seqlen), got rank 2"},
      {"dq_rank_3", on_args<Args>([](Args& a) { a.dq.rank = 3; }), kInvalid,
       "dq: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank 3"},
      {"dk_rank_1", on_args<Args>([](Args& a) { a.dk.rank = 1; }), kInvalid,
       "dk: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank 1"},
      {"dv_rank_3", on_args<Args>([](Args& a) { a.dv.rank = 3; }), kInvalid,
       "dv: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank 3"},
      {"dout_seqlen_zero", on_args<Args>([](Args& a) { a.dout.shape[1] = 0; }), kInvalid,
       "dout: seqlen must be >= 1, got 0"},
      {"lse_seqlen_zero", on_args<Args>([](Args& a) { a.lse.shape[2] = 0; }), kInvalid,
       "lse: seqlen must be >= 1, got 0"},
      {"dq_head_dim_over_int32", on_args<Args>([](Args& a) { a.dq.shape[3] = kOverInt32; }), kInvalid,
       "dq: head_dim 2147483648 is out of range (max 2147483647)"},
      {"dk_stride_negative", on_args<Args>([](Args& a) { a.dk.stride[2] = -128; }), kInvalid,
       "dk: stride of dim 2 (nheads) must be >= 0, got -128"},
      {"dv_last_dim_stride_2", on_args<Args>([](Args& a) { a.dv.stride[3] = 2; }), kInvalid,
       "dv: last dimension must be contiguous (stride 1), got stride 2"},
  };
}

std::vector<Case> dtype_and_shape_cases() {
  return {
      {"head_dim_257_on_device", on_args<Args>([](Args& a) {
         for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv}) resize_dim(*t, 3, 257);
       }),
       kUnsupported,
       "q: head dim 257 is not supported; supported: 1 to 256 (kernels built for head dims 64, 96, 128, 192, 256)"},
      {"dout_dtype_mismatch", on_args<Args>([](Args& a) { a.dout.dtype = DType::kFloat16; }), kInvalid,
       "dout: dtype fp16 does not match q's dtype bf16"},
      {"lse_dtype_not_fp32", on_args<Args>([](Args& a) { a.lse.dtype = DType::kFloat16; }), kInvalid,
       "lse: dtype must be fp32, got fp16"},
      {"dq_dtype_mismatch", on_args<Args>([](Args& a) { a.dq.dtype = DType::kFloat32; }), kInvalid,
       "dq: dtype fp32 does not match q's dtype bf16"},
      {"dk_dtype_mismatch", on_args<Args>([](Args& a) { a.dk.dtype = DType::kFloat16; }), kInvalid,
       "dk: dtype fp16 does not match q's dtype bf16"},
      {"dv_dtype_mismatch", on_args<Args>([](Args& a) { a.dv.dtype = DType::kFloat32; }), kInvalid,
       "dv: dtype fp32 does not match q's dtype bf16"},
      {"batch_mismatch", on_args<Args>([](Args& a) {
         for (TensorView* t : {&a.k, &a.v, &a.dk, &a.dv}) resize_dim(*t, 0, 1);
       }),
       kInvalid, "k: batch 1 does not match q's batch 2"},
      {"dout_seqlen_mismatch", on_args<Args>([](Args& a) { resize_dim(a.dout, 1, 63); }), kInvalid,
       "dout: shape (2, 63, 4, 128) must be (batch, seqlen_q, nheads_q, head_dim_v) = (2, 64, 4, 128)"},
      {"out_batch_mismatch", on_args<Args>([](Args& a) { resize_dim(a.out, 0, 1); }), kInvalid,
       "out: shape (1, 64, 4, 128) must be (batch, seqlen_q, nheads_q, head_dim_v) = (2, 64, 4, 128)"},
      {"lse_seqlen_is_seqlen_k", on_args<Args>([](Args& a) { resize_dim(a.lse, 2, 96); }), kInvalid,
       "lse: shape (2, 4, 96) must be (batch, nheads_q, seqlen_q) = (2, 4, 64)"},
      {"dq_nheads_mismatch", on_args<Args>([](Args& a) { resize_dim(a.dq, 2, 2); }), kInvalid,
       "dq: shape (2, 64, 2, 128) must equal q's shape (2, 64, 4, 128)"},
      {"dk_seqlen_mismatch", on_args<Args>([](Args& a) { resize_dim(a.dk, 1, 64); }), kInvalid,
       "dk: shape (2, 64, 2, 128) must equal k's shape (2, 96, 2, 128)"},
      {"dv_head_dim_mismatch", on_args<Args>([](Args& a) { resize_dim(a.dv, 3, 64); }), kInvalid,
       "dv: shape (2, 96, 2, 64) must equal v's shape (2, 96, 2, 128)"},
  };
}

std::vector<Case> device_cases() {
  return {
      {"dout_not_16_byte_aligned", on_args<Args>([](Args& a) { shift_pointer(a.dout, 8); }), kInvalid,
       "dout: data pointer is not 16-byte aligned (TMA needs it)"},
      {"dq_not_16_byte_aligned", on_args<Args>([](Args& a) { shift_pointer(a.dq, 2); }), kInvalid,
       "dq: data pointer is not 16-byte aligned (TMA needs it)"},
      {"lse_not_element_aligned", on_args<Args>([](Args& a) { shift_pointer(a.lse, 1); }), kInvalid,
       "lse: data pointer is not aligned to its element size"},
      {"dk_row_stride_not_16_bytes",
       on_args<Args>([](Args& a) {
         a.dk = TensorView::strided(a.dk.data, a.dk.dtype, {2, 96, 2, 128}, {96 * 260, 260, 128, 1});
       }),
       kInvalid, "dk: stride 260 of dim 1 (seqlen) is not a multiple of 8 elements (16 bytes; TMA needs it)"},
      {"dv_stride_too_large", on_args<Args>([](Args& a) { a.dv.stride[0] = std::int64_t{1} << 39; }), kInvalid,
       "dv: stride 549755813888 of dim 0 is too large (TMA strides are below 2^40 bytes)"},
      {"dout_not_device_memory",
       [](Args& a, ValidationTarget& t) { t = device_like_target(a.dout.data, "host memory"); }, kInvalid,
       "dout: pointer is host memory, not memory of the current CUDA device"},
      {"dk_not_device_memory",
       [](Args& a, ValidationTarget& t) { t = device_like_target(a.dk.data, "pinned host memory"); }, kInvalid,
       "dk: pointer is pinned host memory, not memory of the current CUDA device"},
      {"lse_not_device_memory",
       [](Args& a, ValidationTarget& t) { t = device_like_target(a.lse.data, "host memory"); }, kInvalid,
       "lse: pointer is host memory, not memory of the current CUDA device"},
  };
}

// A device target whose backward asks a fixed workspace (twice as much in deterministic
// mode), so that the workspace rules are testable without a GPU. `refused`, when set, is
// the one pointer its location check calls host memory.
constexpr std::size_t kWorkspaceBytes = 4096;

ValidationTarget workspace_target(const void* refused = nullptr) {
  ValidationTarget t = device_like_target(refused, "host memory");
  t.backward_workspace = [](const Problem&, bool deterministic) {
    return deterministic ? 2 * kWorkspaceBytes : kWorkspaceBytes;
  };
  return t;
}

// Each case switches to workspace_target() and breaks one workspace rule of arguments
// that carry a valid workspace of kWorkspaceBytes (in a buffer twice that size).
std::vector<Case> workspace_cases() {
  return {
      {"workspace_null",
       [](Args& a, ValidationTarget& t) {
         t = workspace_target();
         a.workspace = nullptr;
       },
       kInvalid, "workspace: data pointer is null; this call needs 4096 bytes (fa3::backward_workspace_size)"},
      {"workspace_null_deterministic",
       [](Args& a, ValidationTarget& t) {
         t = workspace_target();
         a.workspace = nullptr;
         a.deterministic = true;
       },
       kInvalid, "workspace: data pointer is null; this call needs 8192 bytes (fa3::backward_workspace_size)"},
      {"workspace_one_byte_short",
       [](Args& a, ValidationTarget& t) {
         t = workspace_target();
         a.workspace_bytes = kWorkspaceBytes - 1;
       },
       kInvalid, "workspace: 4095 bytes given, 4096 needed (fa3::backward_workspace_size)"},
      {"workspace_too_small_for_deterministic",
       [](Args& a, ValidationTarget& t) {
         t = workspace_target();
         a.deterministic = true;
       },
       kInvalid, "workspace: 4096 bytes given, 8192 needed (fa3::backward_workspace_size)"},
      {"workspace_not_256_byte_aligned",
       [](Args& a, ValidationTarget& t) {
         t = workspace_target();
         a.workspace = static_cast<std::byte*>(a.workspace) + 128;
       },
       kInvalid, "workspace: data pointer is not 256-byte aligned"},
      {"workspace_not_device_memory",
       [](Args& a, ValidationTarget& t) { t = workspace_target(a.workspace); }, kInvalid,
       "workspace: pointer is host memory, not memory of the current CUDA device"},
  };
}

class BackwardRule : public ::testing::TestWithParam<Case> {};
TEST_P(BackwardRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  check_rule<Args>(GetParam(), valid.backward(), &validate_backward);
}
INSTANTIATE_TEST_SUITE_P(Tensors, BackwardRule, ::testing::ValuesIn(tensor_cases()), case_name<Args>);
INSTANTIATE_TEST_SUITE_P(DtypesAndShapes, BackwardRule, ::testing::ValuesIn(dtype_and_shape_cases()),
                         case_name<Args>);
INSTANTIATE_TEST_SUITE_P(Device, BackwardRule, ::testing::ValuesIn(device_cases()), case_name<Args>);

class BackwardWorkspaceRule : public ::testing::TestWithParam<Case> {};
TEST_P(BackwardWorkspaceRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  HostBuffer workspace(2 * kWorkspaceBytes);
  BackwardArgs args = valid.backward();
  args.workspace = workspace.data();
  args.workspace_bytes = kWorkspaceBytes;
  Problem p;
  const Status unbroken = validate_backward(args, workspace_target(), &p);
  ASSERT_TRUE(unbroken.is_ok()) << "the unbroken workspace must pass: " << unbroken.to_string();
  check_rule<Args>(GetParam(), args, &validate_backward);
}
INSTANTIATE_TEST_SUITE_P(Workspace, BackwardWorkspaceRule, ::testing::ValuesIn(workspace_cases()), case_name<Args>);

TEST(ValidateBackward, AsksTheWorkspaceForTheResolvedProblem) {
  ValidArgs valid({.nheads_kv = 1});
  HostBuffer workspace(kWorkspaceBytes);
  BackwardArgs a = valid.backward();
  a.options.causal = true;
  a.deterministic = true;
  a.workspace = workspace.data();
  a.workspace_bytes = kWorkspaceBytes;
  Problem asked;
  bool asked_deterministic = false;
  ValidationTarget t = device_like_target();
  t.backward_workspace = [&](const Problem& p, bool deterministic) {
    asked = p;
    asked_deterministic = deterministic;
    return kWorkspaceBytes;
  };
  Problem p;
  const Status s = validate_backward(a, t, &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(asked_deterministic);
  EXPECT_EQ(asked.batch, 2);
  EXPECT_EQ(asked.seqlen_q, 64);
  EXPECT_EQ(asked.seqlen_k, 96);
  EXPECT_EQ(asked.nheads_q, 4);
  EXPECT_EQ(asked.nheads_kv, 1);
  EXPECT_EQ(asked.head_dim, 128);
  EXPECT_TRUE(asked.causal);
  EXPECT_FLOAT_EQ(asked.softmax_scale, 1.f / std::sqrt(128.f));
}

// The workspace is the last thing checked: a call broken elsewhere as well is refused
// for that, and a size is never asked of a problem that did not validate.
TEST(ValidateBackward, WorkspaceCheckedAfterEveryOtherRule) {
  ValidArgs valid;
  BackwardArgs a = valid.backward();
  a.options.softcap = 30.f;
  ValidationTarget t = device_like_target();
  t.backward_workspace = [](const Problem&, bool) -> std::size_t {
    ADD_FAILURE() << "workspace size asked of an invalid problem";
    return kWorkspaceBytes;
  };
  Problem p;
  const Status s = validate_backward(a, t, &p);
  EXPECT_EQ(s.code(), kUnsupported);
  EXPECT_EQ(s.message(), "softcap is not implemented on this path yet");
}

// The host path has no workspace: a target of host space never asks for one.
TEST(ValidateBackward, HostTargetNeedsNoWorkspace) {
  ValidArgs valid;
  ValidationTarget t = cpu_target();
  t.backward_workspace = [](const Problem&, bool) -> std::size_t {
    ADD_FAILURE() << "workspace size asked on the host path";
    return kWorkspaceBytes;
  };
  Problem p;
  const Status s = validate_backward(valid.backward(), t, &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

// ---- fa3::backward_workspace_size ----

bool backward_kernels_built() { return !hopper::bwd_kernels().empty(); }

// Arguments of a dtype and head dim that backward kernels were built for (when any were).
ArgsShape buildable_shape() {
  ArgsShape s;
  const std::vector<DType> dtypes = hopper::bwd_dtypes();
  const std::vector<int> dims = hopper::bwd_head_dims();
  // bf16 where built: the dtype-mismatch cases break the arguments by switching to fp16.
  if (!dtypes.empty() && std::find(dtypes.begin(), dtypes.end(), DType::kBFloat16) == dtypes.end()) {
    s.dtype = dtypes.front();
  }
  if (!dims.empty()) s.head_dim = std::find(dims.begin(), dims.end(), 128) != dims.end() ? 128 : dims.front();
  return s;
}

// The GPU backward's own target with host buffers standing in for device memory.
ValidationTarget gpu_backward_target_on_host_buffers() {
  ValidationTarget t = gpu_backward_target();
  t.locate = nullptr;
  return t;
}

// Breakages of the options the size query must refuse as backward() does.
std::vector<Case> option_cases() {
  return {
      {"scale_negative", on_args<Args>([](Args& a) { a.options.softmax_scale = -1.f; }), kInvalid,
       "softmax_scale must be finite and > 0 (or 0 for the default 1/sqrt(head_dim)), got -1"},
  };
}

// Every breakage above except those of where memory lives, which the query leaves alone.
std::vector<Case> size_query_cases() {
  std::vector<Case> all;
  for (const auto& list : {tensor_cases(), dtype_and_shape_cases(), device_cases(), option_cases()}) {
    for (const Case& c : list) {
      if (c.name.find("device_memory") == std::string::npos) all.push_back(c);
    }
  }
  return all;
}

// The query refuses what backward() refuses, with the same status, and leaves `bytes`
// alone. With no kernels built, everything valid so far is refused for that.
class BackwardWorkspaceSizeRule : public ::testing::TestWithParam<Case> {};
TEST_P(BackwardWorkspaceSizeRule, RejectsWhatBackwardRejects) {
  ValidArgs valid(buildable_shape());
  BackwardArgs args = valid.backward();
  ValidationTarget unused = device_like_target();
  GetParam().breaks(args, unused);
  Problem p;
  const Status want = validate_backward(args, gpu_backward_target_on_host_buffers(), &p);
  ASSERT_FALSE(want.is_ok());
  std::size_t bytes = 12345;
  const Status got = backward_workspace_size(args, &bytes);
  EXPECT_EQ(got.code(), want.code()) << got.to_string();
  EXPECT_EQ(got.message(), want.message());
  EXPECT_EQ(bytes, 12345u) << "a refused query must leave bytes alone";
}
INSTANTIATE_TEST_SUITE_P(Rules, BackwardWorkspaceSizeRule, ::testing::ValuesIn(size_query_cases()), case_name<Args>);

TEST(BackwardWorkspaceSize, WithoutKernelsSaysSo) {
  if (backward_kernels_built()) GTEST_SKIP() << "backward kernels were built";
  ValidArgs valid;
  std::size_t bytes = 0;
  const Status s = backward_workspace_size(valid.backward(), &bytes);
  EXPECT_EQ(s.code(), kUnsupported);
  EXPECT_EQ(s.message(), "no GPU kernels were built into this library");
}

// For a valid problem the query needs no workspace and no device memory, and answers
// the size backward() then asks for: exactly that much passes the workspace rule, a
// byte less does not.
TEST(BackwardWorkspaceSize, IsTheSizeBackwardAsksFor) {
  if (!backward_kernels_built()) GTEST_SKIP() << "no backward kernels were built";
  ValidArgs valid(buildable_shape());
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "default");
    BackwardArgs a = valid.backward();
    a.deterministic = deterministic;
    std::size_t bytes = 0;
    const Status s = backward_workspace_size(a, &bytes);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_GT(bytes, 0u);

    HostBuffer workspace(bytes);
    a.workspace = workspace.data();
    a.workspace_bytes = bytes;
    Problem p;
    const Status exact = validate_backward(a, gpu_backward_target_on_host_buffers(), &p);
    EXPECT_TRUE(exact.is_ok()) << exact.to_string();
    a.workspace_bytes = bytes - 1;
    const Status short_by_one = validate_backward(a, gpu_backward_target_on_host_buffers(), &p);
    EXPECT_EQ(short_by_one.message(), "workspace: " + std::to_string(bytes - 1) + " bytes given, " +
                                          std::to_string(bytes) + " needed (fa3::backward_workspace_size)");
  }
}

// Windows and the softcap run on the general kernels, whose workspace is laid out as
// the plain ones': the query sizes them, the same.
TEST(BackwardWorkspaceSize, WindowAndSoftcapSizedLikePlain) {
  if (!backward_kernels_built()) GTEST_SKIP() << "no backward kernels were built";
  ValidArgs valid(buildable_shape());
  std::size_t plain = 0;
  ASSERT_TRUE(backward_workspace_size(valid.backward(), &plain).is_ok());
  BackwardArgs window = valid.backward();
  window.options.window_left = 16;
  window.options.window_right = 3;
  BackwardArgs softcap = valid.backward();
  softcap.options.softcap = 30.f;
  for (const BackwardArgs* a : {&window, &softcap}) {
    std::size_t bytes = 0;
    const Status s = backward_workspace_size(*a, &bytes);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(bytes, plain);
  }
}

// What the workspace holds (attention.h): the fp32 dq accumulator and two fp32 row
// statistics (LSE, D) per query row always; fp32 dk and dv accumulators with GQA/MQA;
// and deterministic mode's ordering state on top, more of it with GQA/MQA, whose dk and
// dv sums are ordered too.
TEST(BackwardWorkspaceSize, GrowsWithDeterminismAndGroupedHeads) {
  if (!backward_kernels_built()) GTEST_SKIP() << "no backward kernels were built";
  ArgsShape shape = buildable_shape();
  shape.seqlen_q = 1000;
  shape.seqlen_k = 700;
  shape.nheads_q = 8;
  auto size = [&](std::int64_t nheads_kv, bool deterministic) {
    ArgsShape s = shape;
    s.nheads_kv = nheads_kv;
    ValidArgs valid(s);
    BackwardArgs a = valid.backward();
    a.deterministic = deterministic;
    std::size_t bytes = 0;
    const Status st = backward_workspace_size(a, &bytes);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return bytes;
  };
  const std::size_t mha = size(8, false), mha_det = size(8, true);
  const std::size_t gqa = size(2, false), gqa_det = size(2, true);
  const std::size_t mqa = size(1, false);
  const auto b = static_cast<std::size_t>(shape.batch), d = static_cast<std::size_t>(shape.head_dim);
  const std::size_t q_rows = b * 8 * 1000;
  EXPECT_GE(mha, q_rows * d * 4 + q_rows * 2 * 4);
  EXPECT_GE(gqa, mha + 2 * (b * 2 * 700 * d * 4));
  EXPECT_GE(mqa, mha + 2 * (b * 1 * 700 * d * 4));
  EXPECT_LT(mqa, gqa);
  EXPECT_GT(mha_det, mha);
  EXPECT_GT(gqa_det - gqa, mha_det - mha);
}

TEST(ValidateBackward, FillsProblemFromValidArguments) {
  ValidArgs valid({.nheads_kv = 1});
  BackwardArgs a = valid.backward();
  a.options.causal = true;
  Problem p;
  Status s = validate_backward(a, device_like_target(), &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.seqlen_q, 64);
  EXPECT_EQ(p.seqlen_k, 96);
  EXPECT_EQ(p.nheads_q, 4);
  EXPECT_EQ(p.nheads_kv, 1);
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.head_dim_v, 128);
  EXPECT_FLOAT_EQ(p.softmax_scale, 1.f / std::sqrt(128.f));
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, 0);
}

TEST(ValidateBackward, CpuTargetAcceptsFp32WithWindowAndSoftcap) {
  ValidArgs valid({.head_dim = 40, .dtype = DType::kFloat32});
  BackwardArgs a = valid.backward();
  a.options.window_left = 5;
  a.options.window_right = 2;
  a.options.softcap = 10.f;
  a.options.softmax_scale = 0.25f;
  Problem p;
  Status s = validate_backward(a, cpu_target(), &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(p.head_dim, 40);
  EXPECT_EQ(p.window_left, 5);
  EXPECT_EQ(p.window_right, 2);
  EXPECT_EQ(p.softcap, 10.f);
  EXPECT_EQ(p.softmax_scale, 0.25f);
}

}  // namespace
}  // namespace fa3::test
