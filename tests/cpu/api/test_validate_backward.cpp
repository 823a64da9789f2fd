// validate_backward: the rules on the tensors only the backward pass has (dout, the
// mandatory lse, dq, dk, dv), a sample of the rules it shares with the forward, and
// what a valid call resolves. Options are covered in test_validate_options.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "api/validate.h"
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
      {"head_dim_72_on_device", on_args<Args>([](Args& a) {
         for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv}) resize_dim(*t, 3, 72);
       }),
       kUnsupported, "q: head dim 72 is not supported; supported: 64, 96, 128, 192, 256"},
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
       "dout: shape (2, 63, 4, 128) must equal q's shape (2, 64, 4, 128)"},
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

class BackwardRule : public ::testing::TestWithParam<Case> {};
TEST_P(BackwardRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  check_rule<Args>(GetParam(), valid.backward(), &validate_backward);
}
INSTANTIATE_TEST_SUITE_P(Tensors, BackwardRule, ::testing::ValuesIn(tensor_cases()), case_name<Args>);
INSTANTIATE_TEST_SUITE_P(DtypesAndShapes, BackwardRule, ::testing::ValuesIn(dtype_and_shape_cases()),
                         case_name<Args>);
INSTANTIATE_TEST_SUITE_P(Device, BackwardRule, ::testing::ValuesIn(device_cases()), case_name<Args>);

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
