// The rules of variable-length (varlen) calls, broken one at a time from valid varlen
// arguments (valid_varlen_args.h): the packed layouts of the tensors, the index tensors'
// structure and, on the host, their values; a fixed-length call that sets a varlen
// field; and the GPU's refusal, which comes after every other rule.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "api/validate.h"
#include "fa3/attention.h"
#include "hopper/bwd_dispatch.h"
#include "hopper/fwd_dispatch.h"
#include "rule_case.h"
#include "valid_args.h"
#include "valid_varlen_args.h"

namespace fa3::test {
namespace {

const StatusCode kInvalid = StatusCode::kInvalidArgument;
const StatusCode kUnsupported = StatusCode::kNotSupported;

std::int32_t* int32s(const TensorView& t) { return static_cast<std::int32_t*>(t.data); }

// The rules both passes apply alike: the layouts of q, k, v, out and lse, and the index
// tensors. Value rules restore nothing: each case gets fresh buffers.
template <class Args>
std::vector<RuleCase<Args>> shared_cases() {
  auto on = [](auto f) { return on_args<Args>(f); };
  const TargetKind cpu = TargetKind::kCpu;
  return {
      // Packed layouts.
      {"q_rank_4", on([](Args& a) {
         a.q = TensorView::contiguous(a.q.data, a.q.dtype, {1, 14, 4, 128});
       }),
       kInvalid, "q: expected a 3-d tensor (total, nheads, head_dim), got rank 4", cpu},
      {"lse_rank_3", on([](Args& a) {
         a.lse = TensorView::contiguous(a.lse.data, a.lse.dtype, {1, 4, 14});
       }),
       kInvalid, "lse: expected a 2-d tensor (nheads, total), got rank 3", cpu},
      {"k_total_zero", on([](Args& a) { a.k.shape[0] = 0; }), kInvalid, "k: total must be >= 1, got 0", cpu},
      {"v_last_dim_stride_2", on([](Args& a) { a.v.stride[2] = 2; }), kInvalid,
       "v: last dimension must be contiguous (stride 1), got stride 2", cpu},
      {"k_head_dim_mismatch", on([](Args& a) { resize_dim(a.k, 2, 64); }), kInvalid,
       "k: head dim 64 does not match q's head dim 128", cpu},
      {"v_total_mismatch", on([](Args& a) { resize_dim(a.v, 0, 12); }), kInvalid,
       "v: shape (12, 2, 128) must match k's shape (13, 2, 128) in total and nheads", cpu},
      {"q_nheads_not_multiple", on([](Args& a) { resize_dim(a.q, 1, 3); }), kInvalid,
       "q: nheads 3 is not a multiple of k's nheads 2", cpu},
      {"out_total_mismatch", on([](Args& a) { resize_dim(a.out, 0, 13); }), kInvalid,
       "out: shape (13, 4, 128) must be (total_q, nheads_q, head_dim_v) = (14, 4, 128)", cpu},
      {"lse_total_is_total_k", on([](Args& a) { resize_dim(a.lse, 1, 13); }), kInvalid,
       "lse: shape (4, 13) must be (nheads_q, total_q) = (4, 14)", cpu},
      // The index tensors' structure.
      {"cu_seqlens_k_null", on([](Args& a) { a.varlen.cu_seqlens_k.data = nullptr; }), kInvalid,
       "cu_seqlens_k: data pointer is null; a varlen call needs it with cu_seqlens_q", cpu},
      {"cu_seqlens_q_rank_2", on([](Args& a) { a.varlen.cu_seqlens_q.rank = 2; }), kInvalid,
       "cu_seqlens_q: expected a 1-d tensor (batch + 1), got rank 2", cpu},
      {"cu_seqlens_q_length_1", on([](Args& a) { a.varlen.cu_seqlens_q.shape[0] = 1; }), kInvalid,
       "cu_seqlens_q: shape (1) must be (batch + 1) with batch >= 1", cpu},
      {"cu_seqlens_q_dtype_fp32", on([](Args& a) { a.varlen.cu_seqlens_q.dtype = DType::kFloat32; }), kInvalid,
       "cu_seqlens_q: dtype must be int32, got fp32", cpu},
      {"cu_seqlens_q_stride_2", on([](Args& a) { a.varlen.cu_seqlens_q.stride[0] = 2; }), kInvalid,
       "cu_seqlens_q: must be contiguous (stride 1), got stride 2", cpu},
      {"cu_seqlens_k_length_3", on([](Args& a) { a.varlen.cu_seqlens_k.shape[0] = 3; }), kInvalid,
       "cu_seqlens_k: shape (3) must be (batch + 1) = (4)", cpu},
      {"cu_seqlens_k_rank_0", on([](Args& a) { a.varlen.cu_seqlens_k.rank = 0; }), kInvalid,
       "cu_seqlens_k: expected a 1-d tensor (batch + 1), got rank 0", cpu},
      {"seqused_q_length_4", on([](Args& a) { a.varlen.seqused_q.shape[0] = 4; }), kInvalid,
       "seqused_q: shape (4) must be (batch) = (3)", cpu},
      {"seqused_k_dtype_bf16", on([](Args& a) { a.varlen.seqused_k.dtype = DType::kBFloat16; }), kInvalid,
       "seqused_k: dtype must be int32, got bf16", cpu},
      {"seqused_k_stride_0", on([](Args& a) { a.varlen.seqused_k.stride[0] = 0; }), kInvalid,
       "seqused_k: must be contiguous (stride 1), got stride 0", cpu},
      {"max_seqlen_q_negative", on([](Args& a) { a.varlen.max_seqlen_q = -1; }), kInvalid,
       "max_seqlen_q must be >= 0, got -1", cpu},
      {"max_seqlen_k_negative", on([](Args& a) { a.varlen.max_seqlen_k = -3; }), kInvalid,
       "max_seqlen_k must be >= 0, got -3", cpu},
      // The index tensors' values, read on the host.
      {"cu_seqlens_q_not_from_0", on([](Args& a) { int32s(a.varlen.cu_seqlens_q)[0] = 1; }), kInvalid,
       "cu_seqlens_q: cu_seqlens_q[0] must be 0, got 1", cpu},
      {"cu_seqlens_q_decreasing", on([](Args& a) { int32s(a.varlen.cu_seqlens_q)[2] = 4; }), kInvalid,
       "cu_seqlens_q: cu_seqlens_q[2] = 4 is less than cu_seqlens_q[1] = 5 (must be non-decreasing)", cpu},
      {"cu_seqlens_q_past_total", on([](Args& a) { int32s(a.varlen.cu_seqlens_q)[3] = 15; }), kInvalid,
       "cu_seqlens_q: cu_seqlens_q[3] = 15 exceeds q's total rows, 14", cpu},
      {"cu_seqlens_k_past_total", on([](Args& a) {
         int32s(a.varlen.cu_seqlens_k)[2] = 14;
         int32s(a.varlen.cu_seqlens_k)[3] = 14;
       }),
       kInvalid, "cu_seqlens_k: cu_seqlens_k[3] = 14 exceeds k's total rows, 13", cpu},
      {"seqused_q_over_length", on([](Args& a) { int32s(a.varlen.seqused_q)[0] = 6; }), kInvalid,
       "seqused_q: seqused_q[0] = 6 is outside [0, 5], sequence 0's length in cu_seqlens_q", cpu},
      {"seqused_k_negative", on([](Args& a) { int32s(a.varlen.seqused_k)[1] = -1; }), kInvalid,
       "seqused_k: seqused_k[1] = -1 is outside [0, 3], sequence 1's length in cu_seqlens_k", cpu},
      {"max_seqlen_q_too_small", on([](Args& a) { a.varlen.max_seqlen_q = 6; }), kInvalid,
       "max_seqlen_q: 6 is less than the longest query sequence, 7 (sequence 2)", cpu},
      {"max_seqlen_k_too_small_without_seqused", on([](Args& a) {
         a.varlen.seqused_k = TensorView{};
         a.varlen.max_seqlen_k = 8;
       }),
       kInvalid, "max_seqlen_k: 8 is less than the longest key sequence, 9 (sequence 0)", cpu},
      // Device rules.
      {"cu_seqlens_q_not_element_aligned", on([](Args& a) { shift_pointer(a.varlen.cu_seqlens_q, 2); }), kInvalid,
       "cu_seqlens_q: data pointer is not aligned to its element size", TargetKind::kDeviceWithVarlen},
      {"seqused_q_not_device_memory",
       [](Args& a, ValidationTarget& t) {
         t = device_like_target(a.varlen.seqused_q.data, "host memory");
         t.supports_varlen = true;
       },
       kInvalid, "seqused_q: pointer is host memory, not memory of the current CUDA device",
       TargetKind::kDeviceWithVarlen},
      {"q_packed_stride_not_16_bytes", on([](Args& a) { a.q.stride[0] = 4 * 128 + 4; }), kInvalid,
       "q: stride 516 of dim 0 (total) is not a multiple of 8 elements (16 bytes; TMA needs it)",
       TargetKind::kDeviceWithVarlen},
      {"varlen_on_gpu", [](Args&, ValidationTarget& t) { t.supports_varlen = false; }, kUnsupported,
       "cu_seqlens_q: variable-length batches (varlen) are not implemented on the GPU yet",
       TargetKind::kDeviceWithVarlen},
  };
}

std::vector<RuleCase<BackwardArgs>> backward_cases() {
  using Args = BackwardArgs;
  std::vector<RuleCase<Args>> all = shared_cases<Args>();
  const TargetKind cpu = TargetKind::kCpu;
  std::vector<RuleCase<Args>> own = {
      {"dout_rank_4", on_args<Args>([](Args& a) { a.dout.rank = 4; }), kInvalid,
       "dout: expected a 3-d tensor (total, nheads, head_dim), got rank 4", cpu},
      {"dout_total_mismatch", on_args<Args>([](Args& a) { resize_dim(a.dout, 0, 12); }), kInvalid,
       "dout: shape (12, 4, 128) must be (total_q, nheads_q, head_dim_v) = (14, 4, 128)", cpu},
      {"dq_total_mismatch", on_args<Args>([](Args& a) { resize_dim(a.dq, 0, 13); }), kInvalid,
       "dq: shape (13, 4, 128) must equal q's shape (14, 4, 128)", cpu},
      {"dk_nheads_mismatch", on_args<Args>([](Args& a) { resize_dim(a.dk, 1, 4); }), kInvalid,
       "dk: shape (13, 4, 128) must equal k's shape (13, 2, 128)", cpu},
      {"dv_rank_4", on_args<Args>([](Args& a) { a.dv.rank = 4; }), kInvalid,
       "dv: expected a 3-d tensor (total, nheads, head_dim), got rank 4", cpu},
  };
  for (RuleCase<Args>& c : own) all.push_back(std::move(c));
  return all;
}

// A fixed-length call (4-d tensors) that sets a field only a varlen call has.
template <class Args>
std::vector<RuleCase<Args>> fixed_length_cases() {
  auto on = [](auto f) { return on_args<Args>(f); };
  const TargetKind cpu = TargetKind::kCpu;
  static std::int32_t index[4] = {0, 1, 2, 3};
  const TensorView one = TensorView::contiguous(index, DType::kInt32, {4});
  return {
      {"cu_seqlens_k_without_q", on([one](Args& a) { a.varlen.cu_seqlens_k = one; }), kInvalid,
       "cu_seqlens_k: given without cu_seqlens_q (it belongs to a varlen call)", cpu},
      {"seqused_q_without_cu_seqlens_q", on([one](Args& a) { a.varlen.seqused_q = one; }), kInvalid,
       "seqused_q: given without cu_seqlens_q (it belongs to a varlen call)", cpu},
      {"seqused_k_without_cu_seqlens_q", on([one](Args& a) { a.varlen.seqused_k = one; }), kInvalid,
       "seqused_k: given without cu_seqlens_q (it belongs to a varlen call)", cpu},
      {"max_seqlen_q_without_cu_seqlens_q", on([](Args& a) { a.varlen.max_seqlen_q = 64; }), kInvalid,
       "max_seqlen_q: 64 given without cu_seqlens_q (it belongs to a varlen call); leave it 0", cpu},
      {"max_seqlen_k_without_cu_seqlens_q", on([](Args& a) { a.varlen.max_seqlen_k = 96; }), kInvalid,
       "max_seqlen_k: 96 given without cu_seqlens_q (it belongs to a varlen call); leave it 0", cpu},
  };
}

class ForwardVarlenRule : public ::testing::TestWithParam<RuleCase<ForwardArgs>> {};
TEST_P(ForwardVarlenRule, IsRejectedWithItsMessage) {
  ValidVarlenArgs valid;
  check_rule<ForwardArgs>(GetParam(), valid.forward(), &validate_forward);
}
INSTANTIATE_TEST_SUITE_P(Varlen, ForwardVarlenRule, ::testing::ValuesIn(shared_cases<ForwardArgs>()),
                         case_name<ForwardArgs>);

class BackwardVarlenRule : public ::testing::TestWithParam<RuleCase<BackwardArgs>> {};
TEST_P(BackwardVarlenRule, IsRejectedWithItsMessage) {
  ValidVarlenArgs valid;
  check_rule<BackwardArgs>(GetParam(), valid.backward(), &validate_backward);
}
INSTANTIATE_TEST_SUITE_P(Varlen, BackwardVarlenRule, ::testing::ValuesIn(backward_cases()), case_name<BackwardArgs>);

class ForwardFixedLengthRule : public ::testing::TestWithParam<RuleCase<ForwardArgs>> {};
TEST_P(ForwardFixedLengthRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  check_rule<ForwardArgs>(GetParam(), valid.forward(), &validate_forward);
}
INSTANTIATE_TEST_SUITE_P(Varlen, ForwardFixedLengthRule, ::testing::ValuesIn(fixed_length_cases<ForwardArgs>()),
                         case_name<ForwardArgs>);

class BackwardFixedLengthRule : public ::testing::TestWithParam<RuleCase<BackwardArgs>> {};
TEST_P(BackwardFixedLengthRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  check_rule<BackwardArgs>(GetParam(), valid.backward(), &validate_backward);
}
INSTANTIATE_TEST_SUITE_P(Varlen, BackwardFixedLengthRule, ::testing::ValuesIn(fixed_length_cases<BackwardArgs>()),
                         case_name<BackwardArgs>);

TEST(ValidateVarlen, FillsProblemFromValidArguments) {
  ValidVarlenArgs valid;
  Problem p;
  const Status s = validate_forward(valid.forward(), cpu_target(), &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(p.varlen);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.total_q, 14);
  EXPECT_EQ(p.total_k, 13);
  EXPECT_EQ(p.seqlen_q, 7);
  EXPECT_EQ(p.seqlen_k, 9);
  EXPECT_EQ(p.nheads_q, 4);
  EXPECT_EQ(p.nheads_kv, 2);
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.head_dim_v, 128);
}

// seqused is optional, and max_seqlen may exceed the longest sequence.
TEST(ValidateVarlen, SequsedIsOptionalAndMaxSeqlenAnUpperBound) {
  ValidVarlenArgs valid;
  ForwardArgs a = valid.forward();
  a.varlen.seqused_q = TensorView{};
  a.varlen.seqused_k = TensorView{};
  a.varlen.max_seqlen_q = 100;
  a.varlen.max_seqlen_k = 9;
  Problem p;
  const Status s = validate_forward(a, cpu_target(), &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(p.seqlen_q, 100);
}

// Index tensors in device memory are the kernels' to read: a device target checks their
// structure, never their values (which a host read would fault on).
TEST(ValidateVarlen, DeviceTargetDoesNotReadTheIndexValues) {
  ValidVarlenArgs valid;
  ForwardArgs a = valid.forward();
  int32s(a.varlen.cu_seqlens_q)[0] = 99;
  a.varlen.max_seqlen_q = 0;
  ValidationTarget t = device_like_target();
  t.supports_varlen = true;
  Problem p;
  const Status s = validate_forward(a, t, &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

// The GPU forward and backward run varlen only in a build with FA3_GPU_VARLEN (the
// backward's dispatcher then refuses head dims whose kernels lack the varlen paths).
TEST(ValidateVarlen, GpuTargetsFollowTheVarlenSwitch) {
  EXPECT_EQ(gpu_target().supports_varlen, hopper::fwd_varlen_enabled());
  EXPECT_EQ(gpu_backward_target().supports_varlen, hopper::bwd_varlen_enabled());
  EXPECT_EQ(hopper::bwd_varlen_enabled(), hopper::fwd_varlen_enabled());
  EXPECT_TRUE(cpu_target().supports_varlen);
}

}  // namespace
}  // namespace fa3::test
