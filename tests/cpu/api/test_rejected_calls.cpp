// The public entry points write nothing when they reject a call: outputs filled with a
// NaN bit pattern stay bit-identical. Covers fa3::cpu::forward/backward on host memory,
// and fa3::forward/backward (the GPU entries), which must refuse host pointers whether
// or not a GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "api/validate.h"
#include "fa3/fa3.h"
#include "hopper/bwd_dispatch.h"
#include "valid_args.h"
#include "valid_varlen_args.h"

namespace fa3::test {
namespace {

struct Rejection {
  std::string name;
  std::function<void(AttentionOptions&, TensorView& q, TensorView& k, TensorView& v, TensorView& out,
                     TensorView& lse)>
      breaks;
  StatusCode code;
  std::string message;  // a part of the message that names the argument and the rule
};

void PrintTo(const Rejection& r, std::ostream* os) { *os << r.name; }

std::string rejection_name(const ::testing::TestParamInfo<Rejection>& info) { return info.param.name; }

// Breakages that the forward and the backward reject alike (out and lse are inputs of
// the backward and outputs of the forward).
std::vector<Rejection> rejections() {
  using O = AttentionOptions;
  using T = TensorView;
  return {
      {"k_null", [](O&, T&, T& k, T&, T&, T&) { k.data = nullptr; }, StatusCode::kInvalidArgument,
       "k: data pointer is null"},
      {"v_dtype_mismatch", [](O&, T&, T&, T& v, T&, T&) { v.dtype = DType::kFloat16; },
       StatusCode::kInvalidArgument, "v: dtype fp16 does not match q's dtype bf16"},
      {"head_dim_300",
       [](O&, T& q, T& k, T& v, T& out, T&) {
         for (T* t : {&q, &k, &v, &out}) resize_dim(*t, 3, 300);
       },
       StatusCode::kNotSupported, "q: head dim 300 is not supported; supported: 1 to 256"},
      {"head_dim_v_600", [](O&, T&, T&, T& v, T&, T&) { resize_dim(v, 3, 600); }, StatusCode::kNotSupported,
       "v: head dim 600 is not supported; supported: 1 to 512"},
      {"lse_shape", [](O&, T&, T&, T&, T&, T& lse) { resize_dim(lse, 2, 96); }, StatusCode::kInvalidArgument,
       "lse: shape (2, 4, 96) must be (batch, nheads_q, seqlen_q) = (2, 4, 64)"},
      {"scale_nan", [](O& o, T&, T&, T&, T&, T&) { o.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
       StatusCode::kInvalidArgument, "softmax_scale must be finite and > 0"},
      {"window_conflicts_with_causal",
       [](O& o, T&, T&, T&, T&, T&) {
         o.causal = true;
         o.window_right = 2;
       },
       StatusCode::kInvalidArgument, "window_right 2 conflicts with causal"},
  };
}

void expect_status(const Status& s, StatusCode code, const std::string& part) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(part), std::string::npos) << "message: " << s.message() << "\nexpected: " << part;
}

class CpuForwardRejection : public ::testing::TestWithParam<Rejection> {};
TEST_P(CpuForwardRejection, LeavesOutputsUntouched) {
  const Rejection& r = GetParam();
  ValidArgs valid;
  ForwardArgs a = valid.forward();
  r.breaks(a.options, a.q, a.k, a.v, a.out, a.lse);
  valid.out().fill_nan_pattern();
  valid.lse().fill_nan_pattern();
  const auto out_before = valid.out().snapshot();
  const auto lse_before = valid.lse().snapshot();

  expect_status(cpu::forward(a), r.code, r.message);
  EXPECT_TRUE(valid.out().equals(out_before)) << "out was written by a rejected call";
  EXPECT_TRUE(valid.lse().equals(lse_before)) << "lse was written by a rejected call";
}
INSTANTIATE_TEST_SUITE_P(Rules, CpuForwardRejection, ::testing::ValuesIn(rejections()), rejection_name);

class CpuBackwardRejection : public ::testing::TestWithParam<Rejection> {};
TEST_P(CpuBackwardRejection, LeavesGradientsUntouched) {
  const Rejection& r = GetParam();
  ValidArgs valid;
  BackwardArgs a = valid.backward();
  r.breaks(a.options, a.q, a.k, a.v, a.out, a.lse);
  for (HostBuffer* b : {&valid.dq(), &valid.dk(), &valid.dv()}) b->fill_nan_pattern();
  const auto dq_before = valid.dq().snapshot();
  const auto dk_before = valid.dk().snapshot();
  const auto dv_before = valid.dv().snapshot();

  expect_status(cpu::backward(a), r.code, r.message);
  EXPECT_TRUE(valid.dq().equals(dq_before)) << "dq was written by a rejected call";
  EXPECT_TRUE(valid.dk().equals(dk_before)) << "dk was written by a rejected call";
  EXPECT_TRUE(valid.dv().equals(dv_before)) << "dv was written by a rejected call";
}
INSTANTIATE_TEST_SUITE_P(Rules, CpuBackwardRejection, ::testing::ValuesIn(rejections()), rejection_name);

TEST(CpuForwardRejection, BadSinksLeaveOutputsUntouched) {
  ValidArgs valid;
  ForwardArgs a = valid.forward_with_sinks();
  a.sinks.shape[0] = 3;
  valid.out().fill_nan_pattern();
  valid.lse().fill_nan_pattern();
  const auto out_before = valid.out().snapshot();
  const auto lse_before = valid.lse().snapshot();
  expect_status(cpu::forward(a), StatusCode::kInvalidArgument, "sinks: shape (3) must be (nheads_q) = (4)");
  EXPECT_TRUE(valid.out().equals(out_before));
  EXPECT_TRUE(valid.lse().equals(lse_before));
}

// e4m3 inputs run forward only (their forward's rules: tests/cpu/api/test_validate_fp8.cpp).
TEST(CpuBackwardRejection, E4m3LeavesGradientsUntouched) {
  ValidArgs valid;
  BackwardArgs a = valid.backward();
  a.q.dtype = a.k.dtype = a.v.dtype = a.out.dtype = a.dout.dtype = DType::kFloat8E4M3;
  a.dq.dtype = a.dk.dtype = a.dv.dtype = DType::kFloat8E4M3;
  for (HostBuffer* b : {&valid.dq(), &valid.dk(), &valid.dv()}) b->fill_nan_pattern();
  const auto dq_before = valid.dq().snapshot();
  expect_status(cpu::backward(a), StatusCode::kNotSupported, "q: dtype e4m3 is not supported on the CPU path");
  EXPECT_TRUE(valid.dq().equals(dq_before));
}

TEST(CpuBackwardRejection, BadDsinksLeaveGradientsUntouched) {
  ValidArgs valid;
  BackwardArgs a = valid.backward_with_sinks();
  a.dsinks.dtype = DType::kBFloat16;
  for (HostBuffer* b : {&valid.dq(), &valid.dk(), &valid.dv(), &valid.dsinks()}) b->fill_nan_pattern();
  const auto dq_before = valid.dq().snapshot();
  const auto dk_before = valid.dk().snapshot();
  const auto dv_before = valid.dv().snapshot();
  const auto dsinks_before = valid.dsinks().snapshot();
  expect_status(cpu::backward(a), StatusCode::kInvalidArgument, "dsinks: dtype must be fp32, got bf16");
  EXPECT_TRUE(valid.dq().equals(dq_before));
  EXPECT_TRUE(valid.dk().equals(dk_before));
  EXPECT_TRUE(valid.dv().equals(dv_before));
  EXPECT_TRUE(valid.dsinks().equals(dsinks_before));
}

TEST(CpuBackwardRejection, NamesTheGradientThatBreaksARule) {
  ValidArgs valid;
  BackwardArgs a = valid.backward();
  a.dk.dtype = DType::kFloat16;
  valid.dq().fill_nan_pattern();
  const auto dq_before = valid.dq().snapshot();
  expect_status(cpu::backward(a), StatusCode::kInvalidArgument, "dk: dtype fp16 does not match q's dtype bf16");
  EXPECT_TRUE(valid.dq().equals(dq_before));
}

// A varlen rule broken on values that only the host reads: nothing is written either.
TEST(CpuForwardRejection, BadCuSeqlensLeaveOutputsUntouched) {
  ValidVarlenArgs valid;
  ForwardArgs a = valid.forward();
  static_cast<std::int32_t*>(a.varlen.cu_seqlens_q.data)[2] = 4;
  valid.out().fill_nan_pattern();
  valid.lse().fill_nan_pattern();
  const auto out_before = valid.out().snapshot();
  const auto lse_before = valid.lse().snapshot();
  expect_status(cpu::forward(a), StatusCode::kInvalidArgument,
                "cu_seqlens_q: cu_seqlens_q[2] = 4 is less than cu_seqlens_q[1] = 5 (must be non-decreasing)");
  EXPECT_TRUE(valid.out().equals(out_before));
  EXPECT_TRUE(valid.lse().equals(lse_before));
}

TEST(CpuBackwardRejection, BadSequsedLeavesGradientsUntouched) {
  ValidVarlenArgs valid;
  BackwardArgs a = valid.backward();
  static_cast<std::int32_t*>(a.varlen.seqused_k.data)[1] = 4;
  for (HostBuffer* b : {&valid.dq(), &valid.dk(), &valid.dv()}) b->fill_nan_pattern();
  const auto dq_before = valid.dq().snapshot();
  const auto dk_before = valid.dk().snapshot();
  const auto dv_before = valid.dv().snapshot();
  expect_status(cpu::backward(a), StatusCode::kInvalidArgument,
                "seqused_k: seqused_k[1] = 4 is outside [0, 3], sequence 1's length in cu_seqlens_k");
  EXPECT_TRUE(valid.dq().equals(dq_before));
  EXPECT_TRUE(valid.dk().equals(dk_before));
  EXPECT_TRUE(valid.dv().equals(dv_before));
}

// The GPU entries refuse a varlen call (with host pointers, or without kernels, for an
// earlier reason too) and write nothing. The backward's workspace size depends on the
// shapes alone: a build that runs the call's varlen backward on the GPU (varlen paths, a
// bf16 kernel of head dim 128) gives it, any other refuses.
TEST(GpuForwardRejection, VarlenLeavesOutputsUntouched) {
  ValidVarlenArgs valid;
  valid.out().fill_nan_pattern();
  const auto out_before = valid.out().snapshot();
  EXPECT_FALSE(forward(valid.forward(), nullptr).is_ok());
  EXPECT_TRUE(valid.out().equals(out_before));
  for (HostBuffer* b : {&valid.dq(), &valid.dk(), &valid.dv()}) b->fill_nan_pattern();
  const auto dq_before = valid.dq().snapshot();
  EXPECT_FALSE(backward(valid.backward(), nullptr).is_ok());
  EXPECT_TRUE(valid.dq().equals(dq_before));
  const std::vector<DType> dtypes = hopper::bwd_dtypes();
  const bool runs = build_info().gpu_varlen &&
                    std::find(dtypes.begin(), dtypes.end(), DType::kBFloat16) != dtypes.end() &&
                    hopper::bwd_kernel_head_dim(ValidVarlenArgs::kHeadDim) == ValidVarlenArgs::kHeadDim;
  std::size_t bytes = 0;
  const Status sized = backward_workspace_size(valid.backward(), &bytes);
  EXPECT_EQ(sized.is_ok(), runs) << sized.message();
  if (runs) EXPECT_GT(bytes, 0u);
}

// Arguments valid for the GPU build in every respect but where the memory lives.
ArgsShape gpu_buildable_shape() {
  ArgsShape s;
  const ValidationTarget gpu = gpu_target();
  if (!gpu.dtypes.empty()) s.dtype = gpu.dtypes.front();
  if (!gpu.head_dims.empty()) s.head_dim = gpu.head_dims.front();
  return s;
}

// Host pointers are never device memory of the current device: with a GPU they are
// "host memory", without one "not a CUDA pointer"; a build without GPU kernels stops
// earlier, at the dtype.
void expect_gpu_rejects_host_memory(const Status& s) {
  if (gpu_target().dtypes.empty()) {
    expect_status(s, StatusCode::kNotSupported, "no GPU kernels were built into this library");
  } else {
    expect_status(s, StatusCode::kInvalidArgument, "q: pointer is ");
    EXPECT_NE(s.message().find("not memory of the current CUDA device"), std::string::npos) << s.message();
  }
}

TEST(GpuForwardRejection, HostPointersLeaveOutputsUntouched) {
  ValidArgs valid(gpu_buildable_shape());
  ForwardArgs a = valid.forward();
  valid.out().fill_nan_pattern();
  valid.lse().fill_nan_pattern();
  const auto out_before = valid.out().snapshot();
  const auto lse_before = valid.lse().snapshot();

  expect_gpu_rejects_host_memory(forward(a, nullptr));
  EXPECT_TRUE(valid.out().equals(out_before));
  EXPECT_TRUE(valid.lse().equals(lse_before));
}

TEST(GpuForwardRejection, BrokenShapeLeavesOutputsUntouched) {
  ValidArgs valid(gpu_buildable_shape());
  ForwardArgs a = valid.forward();
  resize_dim(a.out, 1, 63);
  valid.out().fill_nan_pattern();
  const auto out_before = valid.out().snapshot();
  Status s = forward(a, nullptr);
  EXPECT_FALSE(s.is_ok());
  if (!gpu_target().dtypes.empty()) {
    expect_status(s, StatusCode::kInvalidArgument, "out: shape (2, 63, ");
  }
  EXPECT_TRUE(valid.out().equals(out_before));
}

// The kernel-choice entries validate exactly as fa3::forward does.
TEST(GpuForwardRejection, KernelChoiceEntriesRejectLikeForward) {
  ValidArgs valid(gpu_buildable_shape());
  ForwardArgs a = valid.forward();
  valid.out().fill_nan_pattern();
  const auto out_before = valid.out().snapshot();
  expect_gpu_rejects_host_memory(forward_with_kernel(a, "128x128", nullptr));
  std::vector<std::string> names;
  expect_gpu_rejects_host_memory(forward_kernels(a, &names));
  EXPECT_TRUE(valid.out().equals(out_before));

  resize_dim(a.out, 1, 63);
  const Status s = forward_kernels(a, &names);
  EXPECT_FALSE(s.is_ok());
  if (!gpu_target().dtypes.empty()) expect_status(s, StatusCode::kInvalidArgument, "out: shape (2, 63, ");
}

TEST(GpuBackwardRejection, HostPointersLeaveGradientsUntouched) {
  ValidArgs valid(gpu_buildable_shape());
  BackwardArgs a = valid.backward();
  for (HostBuffer* b : {&valid.dq(), &valid.dk(), &valid.dv()}) b->fill_nan_pattern();
  const auto dq_before = valid.dq().snapshot();
  const auto dk_before = valid.dk().snapshot();
  const auto dv_before = valid.dv().snapshot();

  expect_gpu_rejects_host_memory(backward(a, nullptr));
  EXPECT_TRUE(valid.dq().equals(dq_before));
  EXPECT_TRUE(valid.dk().equals(dk_before));
  EXPECT_TRUE(valid.dv().equals(dv_before));
}

}  // namespace
}  // namespace fa3::test
