// The rules of FP8 (e4m3) forward calls, broken one at a time from valid arguments that
// carry every scale: each message names the argument, and a target without FP8 refuses
// e4m3 (naming q) only after every other rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "api/validate.h"
#include "fa3/attention.h"
#include "rule_case.h"
#include "valid_args.h"
#include "valid_fp8_args.h"
#include "valid_varlen_args.h"

namespace fa3::test {
namespace {

const StatusCode kInvalid = StatusCode::kInvalidArgument;
const StatusCode kUnsupported = StatusCode::kNotSupported;
using Args = ForwardArgs;

template <class F>
std::function<void(Args&, ValidationTarget&)> on(F f) {
  return on_args<Args>(f);
}

const char* const kQBlocks = "(batch, nheads_q, ceil(seqlen_q / block_rows))";

std::vector<RuleCase<Args>> fp8_cases() {
  return {
      {"scales_with_bf16_inputs", on([](Args& a) {
         for (TensorView* t : {&a.q, &a.k, &a.v}) t->dtype = DType::kBFloat16;
       }),
       kInvalid, "q_descale: given, but q's dtype is bf16; FP8 scales apply to e4m3 inputs only", TargetKind::kCpu},
      {"block_scales_with_fp16_inputs", on([](Args& a) {
         for (TensorView* t : {&a.q, &a.k, &a.v, &a.out}) t->dtype = DType::kFloat16;
         a.fp8.q_descale = a.fp8.k_descale = a.fp8.v_descale = TensorView{};
       }),
       kInvalid, "q_block_scale: given, but q's dtype is fp16; FP8 scales apply to e4m3 inputs only",
       TargetKind::kCpu},
      {"out_e4m3", on([](Args& a) { a.out.dtype = DType::kFloat8E4M3; }), kInvalid,
       "out: dtype must be bf16 or fp16 for e4m3 inputs, got e4m3", TargetKind::kCpu},
      {"out_fp32", on([](Args& a) { a.out.dtype = DType::kFloat32; }), kInvalid,
       "out: dtype must be bf16 or fp16 for e4m3 inputs, got fp32", TargetKind::kCpu},
      {"v_bf16", on([](Args& a) { a.v.dtype = DType::kBFloat16; }), kInvalid,
       "v: dtype bf16 does not match q's dtype e4m3", TargetKind::kCpu},
      {"q_descale_rank_1", on([](Args& a) { a.fp8.q_descale.rank = 1; }), kInvalid,
       "q_descale: expected a 2-d tensor (batch, nheads_kv), got rank 1", TargetKind::kCpu},
      {"k_descale_bf16", on([](Args& a) { a.fp8.k_descale.dtype = DType::kBFloat16; }), kInvalid,
       "k_descale: dtype must be fp32, got bf16", TargetKind::kCpu},
      {"v_descale_per_query_head", on([](Args& a) { resize_dim(a.fp8.v_descale, 1, 4); }), kInvalid,
       "v_descale: shape (2, 4) must be (batch, nheads_kv) = (2, 2)", TargetKind::kCpu},
      {"q_descale_batch_1", on([](Args& a) { resize_dim(a.fp8.q_descale, 0, 1); }), kInvalid,
       "q_descale: shape (1, 2) must be (batch, nheads_kv) = (2, 2)", TargetKind::kCpu},
      {"q_descale_stride_negative", on([](Args& a) { a.fp8.q_descale.stride[1] = -1; }), kInvalid,
       "q_descale: stride of dim 1 must be >= 0, got -1", TargetKind::kCpu},
      {"k_block_scale_missing", on([](Args& a) { a.fp8.k_block_scale = TensorView{}; }), kInvalid,
       "k_block_scale: missing; block quantization scales q, k and v (give all three block scales or none)",
       TargetKind::kCpu},
      {"q_and_v_block_scales_missing", on([](Args& a) {
         a.fp8.q_block_scale = TensorView{};
         a.fp8.v_block_scale = TensorView{};
       }),
       kInvalid, "q_block_scale: missing; block quantization scales q, k and v (give all three block scales or none)",
       TargetKind::kCpu},
      {"block_rows_0", on([](Args& a) { a.fp8.block_rows = 0; }), kInvalid, "block_rows must be >= 1, got 0",
       TargetKind::kCpu},
      {"q_block_scale_one_block_too_many", on([](Args& a) { resize_dim(a.fp8.q_block_scale, 2, 3); }), kInvalid,
       std::string("q_block_scale: shape (2, 4, 3) must be ") + kQBlocks + " = (2, 4, 2)", TargetKind::kCpu},
      {"block_rows_doubled", on([](Args& a) { a.fp8.block_rows = 64; }), kInvalid,
       std::string("q_block_scale: shape (2, 4, 2) must be ") + kQBlocks + " = (2, 4, 1)", TargetKind::kCpu},
      {"k_block_scale_rank_2", on([](Args& a) { a.fp8.k_block_scale.rank = 2; }), kInvalid,
       "k_block_scale: expected a 3-d tensor (batch, nheads_kv, ceil(seqlen_k / block_rows)), got rank 2",
       TargetKind::kCpu},
      {"v_block_scale_fp16", on([](Args& a) { a.fp8.v_block_scale.dtype = DType::kFloat16; }), kInvalid,
       "v_block_scale: dtype must be fp32, got fp16", TargetKind::kCpu},
      {"v_block_scale_per_query_head", on([](Args& a) { resize_dim(a.fp8.v_block_scale, 1, 4); }), kInvalid,
       "v_block_scale: shape (2, 4, 3) must be (batch, nheads_kv, ceil(seqlen_k / block_rows)) = (2, 2, 3)",
       TargetKind::kCpu},
      {"k_block_scale_stride_negative", on([](Args& a) { a.fp8.k_block_scale.stride[2] = -3; }), kInvalid,
       "k_block_scale: stride of dim 2 must be >= 0, got -3", TargetKind::kCpu},
      {"q_descale_not_element_aligned", on([](Args& a) { shift_pointer(a.fp8.q_descale, 2); }), kInvalid,
       "q_descale: data pointer is not aligned to its element size", TargetKind::kDeviceWithFp8},
      {"v_block_scale_not_device_memory",
       [](Args& a, ValidationTarget& t) {
         t = device_like_target(a.fp8.v_block_scale.data, "host memory");
         t.supports_fp8 = true;
       },
       kInvalid, "v_block_scale: pointer is host memory, not memory of the current CUDA device",
       TargetKind::kDeviceWithFp8},
      {"block_rows_not_the_kernels", [](Args&, ValidationTarget& t) { t.fp8_block_rows = 128; }, kUnsupported,
       "block_rows: 32 is not supported on the GPU; its FP8 kernel reads one scale per 128 rows",
       TargetKind::kDeviceWithFp8},
      {"e4m3_on_gpu", [](Args&, ValidationTarget& t) { t.supports_fp8 = false; }, kUnsupported,
       "q: dtype e4m3 (FP8) is not supported on the GPU yet: the FP8 kernel does not exist (fa3::cpu::forward runs e4m3 "
       "inputs)",
       TargetKind::kDeviceWithFp8},
  };
}

class Fp8Rule : public ::testing::TestWithParam<RuleCase<Args>> {};
TEST_P(Fp8Rule, IsRejectedWithItsMessage) {
  ValidFp8Args valid;
  check_rule<Args>(GetParam(), valid.forward(), &validate_forward);
}
INSTANTIATE_TEST_SUITE_P(Fp8, Fp8Rule, ::testing::ValuesIn(fp8_cases()), case_name<Args>);

// Every scale is optional: e4m3 inputs alone, descales alone, block scales alone.
TEST(ValidateFp8, ScalesAreOptional) {
  ValidFp8Args valid;
  const ForwardArgs all = valid.forward();
  ForwardArgs none = all;
  none.fp8 = Fp8Args{};
  ForwardArgs descales = none;
  descales.fp8.q_descale = all.fp8.q_descale;
  descales.fp8.k_descale = all.fp8.k_descale;
  descales.fp8.v_descale = all.fp8.v_descale;
  ForwardArgs blocks = all;
  blocks.fp8.q_descale = blocks.fp8.k_descale = blocks.fp8.v_descale = TensorView{};
  for (const ForwardArgs& a : {all, none, descales, blocks}) {
    Problem p;
    const Status s = validate_forward(a, cpu_target(), &p);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
}

// A call that breaks a rule gets that rule's message from a target without FP8, not
// the refusal of e4m3, which comes after every other rule.
TEST(ValidateFp8, TargetWithoutFp8RefusesLast) {
  ValidFp8Args valid;
  ForwardArgs a = valid.forward();
  resize_dim(a.fp8.k_descale, 1, 3);
  ValidationTarget t = device_like_target();
  t.fp8_block_rows = 128;
  Problem p;
  Status s = validate_forward(a, t, &p);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_EQ(s.message(), "k_descale: shape (2, 3) must be (batch, nheads_kv) = (2, 2)");
  a = valid.forward();
  a.options.softmax_scale = -1.f;
  s = validate_forward(a, t, &p);
  EXPECT_EQ(s.code(), kInvalid) << s.to_string();
  a.options.softmax_scale = 0.f;
  a.fp8.block_rows = 128;
  for (TensorView* blocks : {&a.fp8.q_block_scale, &a.fp8.k_block_scale, &a.fp8.v_block_scale}) {
    resize_dim(*blocks, 2, 1);
  }
  s = validate_forward(a, t, &p);
  EXPECT_EQ(s.code(), kUnsupported);
  EXPECT_EQ(s.message().rfind("q: dtype e4m3 (FP8) is not supported on the GPU yet", 0), 0u) << s.message();
}

// An e4m3 v may have its keys contiguous instead of its head dim (FlashAttention-3's
// V_colmajor), on the CPU and the device alike (it is read element-wise there, not by
// TMA); other strides of its last dimension, and a 16-bit v so laid out, are refused.
TEST(ValidateFp8, VMayHaveItsKeysContiguous) {
  ValidFp8Args valid;
  ForwardArgs a = valid.forward();
  const std::int64_t keys_inner[4] = {96 * 2 * 128, 1, 96 * 128, 96};
  std::copy(keys_inner, keys_inner + 4, a.v.stride);
  ValidationTarget device = device_like_target();
  device.supports_fp8 = true;
  Problem p;
  for (const ValidationTarget& t : {cpu_target(), device}) {
    const Status s = validate_forward(a, t, &p);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  a.v.stride[1] = 2;
  Status s = validate_forward(a, cpu_target(), &p);
  EXPECT_EQ(s.message(), "v: last dimension must be contiguous (stride 1), got stride 96 (an e4m3 v may have its "
                         "seqlen dimension contiguous instead)");
  a = valid.forward();
  std::copy(keys_inner, keys_inner + 4, a.v.stride);
  for (TensorView* t : {&a.q, &a.k, &a.v}) t->dtype = DType::kBFloat16;
  a.fp8 = Fp8Args{};
  s = validate_forward(a, cpu_target(), &p);
  EXPECT_EQ(s.message(), "v: last dimension must be contiguous (stride 1), got stride 96");
}

// Where the FP8 kernels transpose V in shared memory (ValidationTarget::fp8_v_by_tma), TMA
// reads an e4m3 v: its base and every stride but the contiguous one must be 16-byte
// multiples, with its head dim contiguous or its keys; a device that transposes into the
// workspace reads it element-wise and takes either.
TEST(ValidateFp8, VReadByTmaNeeds16ByteStrides) {
  ValidFp8Args valid;
  ValidationTarget by_tma = device_like_target();
  by_tma.supports_fp8 = true;
  by_tma.fp8_v_by_tma = true;
  ValidationTarget element_wise = by_tma;
  element_wise.fp8_v_by_tma = false;
  Problem p;
  ForwardArgs a = valid.forward();
  EXPECT_TRUE(validate_forward(a, by_tma, &p).is_ok());
  // Keys contiguous, rows of 96 keys (16-byte multiples): TMA takes it.
  const std::int64_t keys_inner[4] = {96 * 2 * 128, 1, 96 * 128, 96};
  std::copy(keys_inner, keys_inner + 4, a.v.stride);
  EXPECT_TRUE(validate_forward(a, by_tma, &p).is_ok());
  // Rows of 100 keys: the head dim's stride is not.
  const std::int64_t unaligned[4] = {100 * 2 * 128, 1, 100 * 128, 100};
  std::copy(unaligned, unaligned + 4, a.v.stride);
  Status s = validate_forward(a, by_tma, &p);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_EQ(s.message(), "v: stride 100 of dim 3 (head_dim) is not a multiple of 16 elements (16 bytes; TMA needs it)");
  EXPECT_TRUE(validate_forward(a, element_wise, &p).is_ok());
  // A base 8 bytes off.
  a = valid.forward();
  a.v.data = static_cast<char*>(a.v.data) + 8;
  s = validate_forward(a, by_tma, &p);
  EXPECT_EQ(s.message(), "v: data pointer is not 16-byte aligned (TMA needs it)");
  EXPECT_TRUE(validate_forward(a, element_wise, &p).is_ok());
}

// ValidVarlenArgs (3 sequences, max_seqlen_q 7, max_seqlen_k 9, 4 query heads on 2 KV
// heads) in e4m3 with out bf16, every scale given: descales (3, 2), block scales of
// 128 rows (3, 4, 1) and (3, 2, 1).
class ValidFp8VarlenArgs {
 public:
  ValidFp8VarlenArgs() : descales_(3 * 2 * 3 * sizeof(float)), blocks_((3 * 4 + 2 * 3 * 2) * sizeof(float)) {}

  ForwardArgs forward() {
    ForwardArgs a = valid_.forward();
    for (TensorView* t : {&a.q, &a.k, &a.v}) t->dtype = DType::kFloat8E4M3;
    float* d = reinterpret_cast<float*>(descales_.data());
    float* b = reinterpret_cast<float*>(blocks_.data());
    a.fp8.q_descale = TensorView::contiguous(d, DType::kFloat32, {3, 2});
    a.fp8.k_descale = TensorView::contiguous(d + 6, DType::kFloat32, {3, 2});
    a.fp8.v_descale = TensorView::contiguous(d + 12, DType::kFloat32, {3, 2});
    a.fp8.q_block_scale = TensorView::contiguous(b, DType::kFloat32, {3, 4, 1});
    a.fp8.k_block_scale = TensorView::contiguous(b + 12, DType::kFloat32, {3, 2, 1});
    a.fp8.v_block_scale = TensorView::contiguous(b + 18, DType::kFloat32, {3, 2, 1});
    a.fp8.block_rows = 128;
    return a;
  }

 private:
  ValidVarlenArgs valid_;
  HostBuffer descales_, blocks_;
};

// A varlen call's scales are per sequence: descales (batch, nheads_kv) and block scales
// counted from each sequence's first row, as many as max_seqlen needs.
TEST(ValidateFp8, VarlenScalesArePerSequence) {
  ValidFp8VarlenArgs valid;
  Problem p;
  Status s = validate_forward(valid.forward(), cpu_target(), &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(p.varlen);
  EXPECT_TRUE(p.fp8_block_scales);

  ForwardArgs a = valid.forward();
  resize_dim(a.fp8.k_descale, 0, 2);
  s = validate_forward(a, cpu_target(), &p);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_EQ(s.message(), "k_descale: shape (2, 2) must be (batch, nheads_kv) = (3, 2)");

  a = valid.forward();
  a.fp8.block_rows = 4;  // 7 query rows: 2 blocks of 4
  s = validate_forward(a, cpu_target(), &p);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_EQ(s.message(),
            "q_block_scale: shape (3, 4, 1) must be (batch, nheads_q, ceil(max_seqlen_q / block_rows)) = (3, 4, 2)");
}

// A device target runs varlen e4m3 calls only where its build says so, and says which
// option it is; the refusal comes after every rule of the call itself.
TEST(ValidateFp8, DeviceTargetWithoutFp8VarlenRefusesThem) {
  ValidFp8VarlenArgs valid;
  ValidationTarget t = device_like_target();
  t.supports_varlen = true;
  t.supports_fp8 = true;
  t.fp8_block_rows = 128;
  Problem p;
  Status s = validate_forward(valid.forward(), t, &p);
  EXPECT_EQ(s.code(), kUnsupported);
  EXPECT_EQ(s.message(),
            "q: e4m3 inputs in a varlen call are not supported on the GPU in this build (FA3_GPU_FP8_VARLEN; "
            "fa3::cpu::forward runs them)");
  ForwardArgs a = valid.forward();
  resize_dim(a.fp8.v_descale, 1, 4);
  s = validate_forward(a, t, &p);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_EQ(s.message(), "v_descale: shape (3, 4) must be (batch, nheads_kv) = (3, 2)");
  t.supports_fp8_varlen = true;
  s = validate_forward(valid.forward(), t, &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(ValidateFp8, BackwardRefusesE4m3) {
  ArgsShape shape;
  shape.dtype = DType::kFloat8E4M3;
  ValidArgs valid(shape);
  Problem p;
  const Status s = validate_backward(valid.backward(), cpu_target(), &p);
  EXPECT_EQ(s.code(), kUnsupported);
  EXPECT_EQ(s.message(), "q: dtype e4m3 is not supported on the CPU path; supported: fp32, fp16, bf16");
}

}  // namespace
}  // namespace fa3::test
