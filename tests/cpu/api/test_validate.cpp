// validate_forward: one test per rule on the tensors (presence, rank, sizes, strides,
// dtypes, shapes, head dims, device alignment and location), plus what a valid call
// resolves into its Problem. Options are covered in test_validate_options.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "api/validate.h"
#include "fa3/device.h"
#include "hopper/kvcache.h"
#include "rule_case.h"
#include "valid_args.h"

namespace fa3::test {
namespace {

using Case = RuleCase<ForwardArgs>;
using Args = ForwardArgs;

constexpr std::int64_t kOverInt32 = std::int64_t{1} << 31;
const StatusCode kInvalid = StatusCode::kInvalidArgument;
const StatusCode kUnsupported = StatusCode::kNotSupported;

// The base shape (see ArgsShape): q and out (2, 64, 4, 128), k and v (2, 96, 2, 128),
// lse (2, 4, 64), bf16.
std::vector<Case> tensor_cases() {
  return {
      // Presence.
      {"q_null", on_args<Args>([](Args& a) { a.q.data = nullptr; }), kInvalid, "q: data pointer is null"},
      {"k_null", on_args<Args>([](Args& a) { a.k.data = nullptr; }), kInvalid, "k: data pointer is null"},
      {"v_null", on_args<Args>([](Args& a) { a.v.data = nullptr; }), kInvalid, "v: data pointer is null"},
      {"out_null", on_args<Args>([](Args& a) { a.out.data = nullptr; }), kInvalid, "out: data pointer is null"},
      // Rank.
      {"q_rank_3", on_args<Args>([](Args& a) { a.q.rank = 3; }), kInvalid,
       "q: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank 3"},
      {"k_rank_2", on_args<Args>([](Args& a) { a.k.rank = 2; }), kInvalid,
       "k: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank 2"},
      {"lse_rank_4", on_args<Args>([](Args& a) { a.lse.rank = 4; }), kInvalid,
       "lse: expected a 3-d tensor (batch, nheads, seqlen), got rank 4"},
      // Sizes below 1.
      {"q_batch_zero", on_args<Args>([](Args& a) { a.q.shape[0] = 0; }), kInvalid, "q: batch must be >= 1, got 0"},
      {"k_seqlen_zero", on_args<Args>([](Args& a) { a.k.shape[1] = 0; }), kInvalid,
       "k: seqlen must be >= 1, got 0"},
      {"v_nheads_zero", on_args<Args>([](Args& a) { a.v.shape[2] = 0; }), kInvalid,
       "v: nheads must be >= 1, got 0"},
      {"out_head_dim_negative", on_args<Args>([](Args& a) { a.out.shape[3] = -1; }), kInvalid,
       "out: head_dim must be >= 1, got -1"},
      {"lse_nheads_zero", on_args<Args>([](Args& a) { a.lse.shape[1] = 0; }), kInvalid,
       "lse: nheads must be >= 1, got 0"},
      // Sizes above int32.
      {"q_seqlen_over_int32", on_args<Args>([](Args& a) { a.q.shape[1] = kOverInt32; }), kInvalid,
       "q: seqlen 2147483648 is out of range (max 2147483647)"},
      {"v_nheads_over_int32", on_args<Args>([](Args& a) { a.v.shape[2] = kOverInt32; }), kInvalid,
       "v: nheads 2147483648 is out of range (max 2147483647)"},
      {"lse_batch_over_int32", on_args<Args>([](Args& a) { a.lse.shape[0] = kOverInt32; }), kInvalid,
       "lse: batch 2147483648 is out of range (max 2147483647)"},
      // Negative strides.
      {"q_batch_stride_negative", on_args<Args>([](Args& a) { a.q.stride[0] = -1; }), kInvalid,
       "q: stride of dim 0 (batch) must be >= 0, got -1"},
      {"k_seqlen_stride_negative", on_args<Args>([](Args& a) { a.k.stride[1] = -256; }), kInvalid,
       "k: stride of dim 1 (seqlen) must be >= 0, got -256"},
      {"lse_nheads_stride_negative", on_args<Args>([](Args& a) { a.lse.stride[1] = -64; }), kInvalid,
       "lse: stride of dim 1 (nheads) must be >= 0, got -64"},
      // Last dimension contiguous.
      {"v_last_dim_stride_2", on_args<Args>([](Args& a) { a.v.stride[3] = 2; }), kInvalid,
       "v: last dimension must be contiguous (stride 1), got stride 2"},
      {"out_last_dim_stride_0", on_args<Args>([](Args& a) { a.out.stride[3] = 0; }), kInvalid,
       "out: last dimension must be contiguous (stride 1), got stride 0"},
  };
}

std::vector<Case> dtype_cases() {
  auto all_dtype = [](Args& a, DType d) { a.q.dtype = a.k.dtype = a.v.dtype = a.out.dtype = d; };
  return {
      {"no_kernels_built", [](Args&, ValidationTarget& t) { t.dtypes.clear(); }, kUnsupported,
       "no GPU kernels were built into this library"},
      {"dtype_fp32_on_device", on_args<Args>([all_dtype](Args& a) { all_dtype(a, DType::kFloat32); }),
       kUnsupported, "q: dtype fp32 is not supported on the GPU; supported: bf16, fp16"},
      {"dtype_e4m3_on_device", on_args<Args>([](Args& a) { a.q.dtype = a.k.dtype = a.v.dtype = DType::kFloat8E4M3; }),
       kUnsupported,
       "q: dtype e4m3 (FP8) is not supported on the GPU yet: the FP8 kernel does not exist (fa3::cpu::forward runs e4m3 "
       "inputs)"},
      {"k_dtype_mismatch", on_args<Args>([](Args& a) { a.k.dtype = DType::kFloat16; }), kInvalid,
       "k: dtype fp16 does not match q's dtype bf16"},
      {"v_dtype_mismatch", on_args<Args>([](Args& a) { a.v.dtype = DType::kFloat32; }), kInvalid,
       "v: dtype fp32 does not match q's dtype bf16"},
      {"out_dtype_mismatch", on_args<Args>([](Args& a) { a.out.dtype = DType::kFloat16; }), kInvalid,
       "out: dtype fp16 does not match q's dtype bf16"},
      {"lse_dtype_not_fp32", on_args<Args>([](Args& a) { a.lse.dtype = DType::kBFloat16; }), kInvalid,
       "lse: dtype must be fp32, got bf16"},
  };
}

std::vector<Case> shape_cases() {
  auto all_head_dim = [](Args& a, std::int64_t d) {
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.out}) resize_dim(*t, 3, d);
  };
  return {
      {"head_dim_257_on_device", on_args<Args>([all_head_dim](Args& a) { all_head_dim(a, 257); }), kUnsupported,
       "q: head dim 257 is not supported; supported: 1 to 256 (kernels built for head dims 64, 96, 128, 192, 256)"},
      {"head_dim_111_on_device", on_args<Args>([all_head_dim](Args& a) { all_head_dim(a, 111); }), kUnsupported,
       "q: head dim 111 is not a multiple of 8 (16 bytes), as the GPU needs; pad it with zero columns "
       "(flash_attn_func does)"},
      {"head_dim_129_past_the_built_kernels",
       [all_head_dim](Args& a, ValidationTarget& t) {
         all_head_dim(a, 129);
         t.head_dims = {64, 128};
       },
       kUnsupported, "q: head dim 129 is not supported; supported: 1 to 128 (kernels built for head dims 64, 128)"},
      {"head_dim_257_on_cpu", on_args<Args>([all_head_dim](Args& a) { all_head_dim(a, 257); }), kUnsupported,
       "q: head dim 257 is not supported; supported: 1 to 256", TargetKind::kCpu},
      {"batch_mismatch", on_args<Args>([](Args& a) {
         resize_dim(a.k, 0, 3);
         resize_dim(a.v, 0, 3);
       }),
       kInvalid, "k: batch 3 does not match q's batch 2"},
      {"k_head_dim_mismatch", on_args<Args>([](Args& a) { resize_dim(a.k, 3, 64); }), kInvalid,
       "k: head dim 64 does not match q's head dim 128"},
      {"v_seqlen_mismatch", on_args<Args>([](Args& a) { resize_dim(a.v, 1, 95); }), kInvalid,
       "v: shape (2, 95, 2, 128) must match k's shape (2, 96, 2, 128) in batch, seqlen and nheads"},
      {"v_nheads_mismatch", on_args<Args>([](Args& a) { resize_dim(a.v, 2, 1); }), kInvalid,
       "v: shape (2, 96, 1, 128) must match k's shape (2, 96, 2, 128) in batch, seqlen and nheads"},
      {"v_batch_mismatch", on_args<Args>([](Args& a) { resize_dim(a.v, 0, 1); }), kInvalid,
       "v: shape (1, 96, 2, 128) must match k's shape (2, 96, 2, 128) in batch, seqlen and nheads"},
      {"v_head_dim_differs_on_device", on_args<Args>([](Args& a) {
         resize_dim(a.v, 3, 64);
         resize_dim(a.out, 3, 64);
       }),
       kUnsupported,
       "v: head dim 64 differs from q's head dim 128; a separate V head dim is not implemented on the GPU yet"},
      {"nheads_not_multiple", on_args<Args>([](Args& a) {
         resize_dim(a.q, 2, 3);
         resize_dim(a.out, 2, 3);
         resize_dim(a.lse, 1, 3);
       }),
       kInvalid, "q: nheads 3 is not a multiple of k's nheads 2"},
      {"out_seqlen_mismatch", on_args<Args>([](Args& a) { resize_dim(a.out, 1, 63); }), kInvalid,
       "out: shape (2, 63, 4, 128) must be (batch, seqlen_q, nheads_q, head_dim_v) = (2, 64, 4, 128)"},
      {"out_head_dim_mismatch", on_args<Args>([](Args& a) { resize_dim(a.out, 3, 64); }), kInvalid,
       "out: shape (2, 64, 4, 64) must be (batch, seqlen_q, nheads_q, head_dim_v) = (2, 64, 4, 128)"},
      {"out_nheads_is_nheads_kv", on_args<Args>([](Args& a) { resize_dim(a.out, 2, 2); }), kInvalid,
       "out: shape (2, 64, 2, 128) must be (batch, seqlen_q, nheads_q, head_dim_v) = (2, 64, 4, 128)"},
      {"lse_seqlen_is_seqlen_k", on_args<Args>([](Args& a) { resize_dim(a.lse, 2, 96); }), kInvalid,
       "lse: shape (2, 4, 96) must be (batch, nheads_q, seqlen_q) = (2, 4, 64)"},
      {"lse_nheads_is_nheads_kv", on_args<Args>([](Args& a) { resize_dim(a.lse, 1, 2); }), kInvalid,
       "lse: shape (2, 2, 64) must be (batch, nheads_q, seqlen_q) = (2, 4, 64)"},
  };
}

// Rules of the device target only: TMA alignment and strides, and where memory lives.
std::vector<Case> device_cases() {
  return {
      {"q_not_16_byte_aligned", on_args<Args>([](Args& a) { shift_pointer(a.q, 8); }), kInvalid,
       "q: data pointer is not 16-byte aligned (TMA needs it)"},
      {"k_not_16_byte_aligned", on_args<Args>([](Args& a) { shift_pointer(a.k, 2); }), kInvalid,
       "k: data pointer is not 16-byte aligned (TMA needs it)"},
      {"v_not_16_byte_aligned", on_args<Args>([](Args& a) { shift_pointer(a.v, 4); }), kInvalid,
       "v: data pointer is not 16-byte aligned (TMA needs it)"},
      {"out_not_16_byte_aligned", on_args<Args>([](Args& a) { shift_pointer(a.out, 8); }), kInvalid,
       "out: data pointer is not 16-byte aligned (TMA needs it)"},
      {"lse_not_element_aligned", on_args<Args>([](Args& a) { shift_pointer(a.lse, 2); }), kInvalid,
       "lse: data pointer is not aligned to its element size"},
      {"q_head_stride_not_16_bytes",
       on_args<Args>([](Args& a) {
         a.q = TensorView::strided(a.q.data, a.q.dtype, {2, 64, 4, 128}, {64 * 528, 528, 132, 1});
       }),
       kInvalid, "q: stride 132 of dim 2 (nheads) is not a multiple of 8 elements (16 bytes; TMA needs it)"},
      {"k_row_stride_not_16_bytes",
       on_args<Args>([](Args& a) {
         a.k = TensorView::strided(a.k.data, a.k.dtype, {2, 96, 2, 128}, {96 * 260, 260, 128, 1});
       }),
       kInvalid, "k: stride 260 of dim 1 (seqlen) is not a multiple of 8 elements (16 bytes; TMA needs it)"},
      {"v_batch_stride_not_16_bytes", on_args<Args>([](Args& a) { a.v.stride[0] = 96 * 256 + 4; }), kInvalid,
       "v: stride 24580 of dim 0 (batch) is not a multiple of 8 elements (16 bytes; TMA needs it)"},
      {"out_stride_too_large", on_args<Args>([](Args& a) { a.out.stride[0] = std::int64_t{1} << 39; }), kInvalid,
       "out: stride 549755813888 of dim 0 is too large (TMA strides are below 2^40 bytes)"},
      {"q_not_device_memory", [](Args& a, ValidationTarget& t) { t = device_like_target(a.q.data, "host memory"); },
       kInvalid, "q: pointer is host memory, not memory of the current CUDA device"},
      {"k_not_device_memory",
       [](Args& a, ValidationTarget& t) { t = device_like_target(a.k.data, "pinned host memory"); }, kInvalid,
       "k: pointer is pinned host memory, not memory of the current CUDA device"},
      {"v_not_device_memory",
       [](Args& a, ValidationTarget& t) { t = device_like_target(a.v.data, "not a CUDA pointer"); }, kInvalid,
       "v: pointer is not a CUDA pointer, not memory of the current CUDA device"},
      {"out_on_other_device",
       [](Args& a, ValidationTarget& t) {
         t = device_like_target(a.out.data, "memory of CUDA device 1 (current device is 0)");
       },
       kInvalid, "out: pointer is memory of CUDA device 1 (current device is 0), not memory of the current CUDA device"},
      {"lse_not_device_memory",
       [](Args& a, ValidationTarget& t) { t = device_like_target(a.lse.data, "host memory"); }, kInvalid,
       "lse: pointer is host memory, not memory of the current CUDA device"},
  };
}

class ForwardTensorRule : public ::testing::TestWithParam<Case> {};
TEST_P(ForwardTensorRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  check_rule<Args>(GetParam(), valid.forward(), &validate_forward);
}
INSTANTIATE_TEST_SUITE_P(Tensors, ForwardTensorRule, ::testing::ValuesIn(tensor_cases()), case_name<Args>);
INSTANTIATE_TEST_SUITE_P(Dtypes, ForwardTensorRule, ::testing::ValuesIn(dtype_cases()), case_name<Args>);
INSTANTIATE_TEST_SUITE_P(Shapes, ForwardTensorRule, ::testing::ValuesIn(shape_cases()), case_name<Args>);
INSTANTIATE_TEST_SUITE_P(Device, ForwardTensorRule, ::testing::ValuesIn(device_cases()), case_name<Args>);

// ---- What a valid call resolves ----

TEST(ValidateForward, FillsProblemFromValidArguments) {
  ValidArgs valid;
  Problem p;
  Status s = validate_forward(valid.forward(), device_like_target(), &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.seqlen_q, 64);
  EXPECT_EQ(p.seqlen_k, 96);
  EXPECT_EQ(p.nheads_q, 4);
  EXPECT_EQ(p.nheads_kv, 2);
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.head_dim_v, 128);
  EXPECT_EQ(p.group_size(), 2);
  EXPECT_FLOAT_EQ(p.softmax_scale, 1.f / std::sqrt(128.f));  // 0 selects the default
  EXPECT_FALSE(p.causal);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, -1);
  EXPECT_FALSE(p.has_window());
  EXPECT_EQ(p.softcap, 0.f);
}

TEST(ValidateForward, CausalBecomesWindowRightZero) {
  ValidArgs valid;
  for (int window_right : {-1, 0}) {  // both spell plain causal
    ForwardArgs a = valid.forward();
    a.options.causal = true;
    a.options.window_right = window_right;
    Problem p;
    Status s = validate_forward(a, device_like_target(), &p);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_TRUE(p.causal);
    EXPECT_EQ(p.window_left, -1);
    EXPECT_EQ(p.window_right, 0);
  }
}

TEST(ValidateForward, ExplicitScaleIsKept) {
  ValidArgs valid;
  ForwardArgs a = valid.forward();
  a.options.softmax_scale = 0.5f;
  Problem p;
  ASSERT_TRUE(validate_forward(a, device_like_target(), &p).is_ok());
  EXPECT_EQ(p.softmax_scale, 0.5f);
}

TEST(ValidateForward, DefaultScaleFollowsHeadDim) {
  ValidArgs valid({.head_dim = 64});
  Problem p;
  ASSERT_TRUE(validate_forward(valid.forward(), device_like_target(), &p).is_ok());
  EXPECT_FLOAT_EQ(p.softmax_scale, 0.125f);
}

TEST(ValidateForward, LseIsOptional) {
  ValidArgs valid;
  ForwardArgs a = valid.forward();
  a.lse = TensorView{};
  Problem p;
  Status s = validate_forward(a, device_like_target(), &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(ValidateForward, CpuTargetResolvesWindowAndSoftcap) {
  ValidArgs valid;
  ForwardArgs a = valid.forward();
  a.options.window_left = 8;
  a.options.window_right = 4;
  a.options.softcap = 30.f;
  Problem p;
  Status s = validate_forward(a, cpu_target(), &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_FALSE(p.causal);
  EXPECT_EQ(p.window_left, 8);
  EXPECT_EQ(p.window_right, 4);
  EXPECT_EQ(p.softcap, 30.f);

  a.options = {};
  a.options.causal = true;
  a.options.window_left = 16;
  ASSERT_TRUE(validate_forward(a, cpu_target(), &p).is_ok());
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.window_left, 16);
  EXPECT_EQ(p.window_right, 0);

  a.options = {};
  a.options.attention_chunk = 64;
  ASSERT_TRUE(validate_forward(a, cpu_target(), &p).is_ok());
  EXPECT_EQ(p.chunk, 64);
}

TEST(ValidateForward, CpuTargetAcceptsEveryHostDtypeAndHeadDim) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (std::int64_t d : {1, 72, 256}) {
      ValidArgs valid({.seqlen_q = 3, .seqlen_k = 5, .head_dim = d, .dtype = dtype});
      Problem p;
      Status s = validate_forward(valid.forward(), cpu_target(), &p);
      EXPECT_TRUE(s.is_ok()) << dtype_name(dtype) << " d=" << d << ": " << s.to_string();
    }
  }
}

// Host memory has no TMA: neither its alignment nor its stride rules apply.
TEST(ValidateForward, HostTargetSkipsDeviceRules) {
  ValidArgs valid;
  ForwardArgs a = valid.forward();
  shift_pointer(a.k, 2);
  a.q = TensorView::strided(a.q.data, a.q.dtype, {2, 64, 4, 128}, {64 * 528, 528, 132, 1});
  Problem p;
  Status s = validate_forward(a, cpu_target(), &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(ValidateForward, DeviceAcceptsMqaAndPaddedStrides) {
  ValidArgs valid({.nheads_kv = 1});
  ForwardArgs a = valid.forward();
  // Heads padded to 136 elements (272 bytes): a 16-byte multiple, so TMA can read it.
  a.q = TensorView::strided(a.q.data, a.q.dtype, {2, 64, 4, 128}, {64 * 544, 544, 136, 1});
  Problem p;
  Status s = validate_forward(a, device_like_target(), &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(p.group_size(), 4);
}

// lse is written by plain stores, not TMA: element alignment is enough.
TEST(ValidateForward, DeviceLseNeedsOnlyElementAlignment) {
  ValidArgs valid;
  ForwardArgs a = valid.forward();
  shift_pointer(a.lse, 4);
  Problem p;
  Status s = validate_forward(a, device_like_target(), &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

// ---- The library's own targets ----

TEST(Targets, GpuTargetMatchesTheBuild) {
  const ValidationTarget t = gpu_target();
  const BuildInfo& build = build_info();
  EXPECT_EQ(t.space, ValidationTarget::Space::kDevice);
  EXPECT_TRUE(static_cast<bool>(t.locate));
  // Every mask and score option runs on the general kernels, in both directions.
  for (const ValidationTarget& target : {t, gpu_backward_target()}) {
    EXPECT_TRUE(target.supports_window);
    EXPECT_TRUE(target.supports_softcap);
    EXPECT_TRUE(target.supports_sinks);
    EXPECT_TRUE(target.supports_chunk);
  }
  std::vector<std::string> names;
  for (DType d : t.dtypes) names.push_back(dtype_name(d));
  std::vector<std::string> built = build.dtypes;
  std::sort(names.begin(), names.end());
  std::sort(built.begin(), built.end());
  EXPECT_EQ(names, built);
  std::vector<int> head_dims = build.head_dims;
  std::sort(head_dims.begin(), head_dims.end());
  EXPECT_EQ(t.head_dims, head_dims);
}

TEST(Targets, CpuTargetIsHostWithEveryFeature) {
  const ValidationTarget t = cpu_target();
  EXPECT_EQ(t.space, ValidationTarget::Space::kHost);
  EXPECT_EQ(t.dtypes, (std::vector<DType>{DType::kFloat32, DType::kFloat16, DType::kBFloat16}));
  EXPECT_TRUE(t.head_dims.empty());
  EXPECT_EQ(t.max_head_dim, 256);
  EXPECT_EQ(t.max_head_dim_v, 512);
  EXPECT_TRUE(t.separate_head_dim_v);
  EXPECT_TRUE(t.supports_window);
  EXPECT_TRUE(t.supports_softcap);
  EXPECT_TRUE(t.supports_sinks);
  EXPECT_TRUE(t.supports_chunk);
  EXPECT_TRUE(t.supports_varlen);
  EXPECT_TRUE(t.supports_fp8);
  EXPECT_TRUE(t.supports_fp8_varlen);
  EXPECT_TRUE(t.supports_fp8_kvcache);
  EXPECT_FALSE(static_cast<bool>(t.locate));
}

// Varlen and KV-cache e4m3 calls run on the GPU only in a build whose BuildInfo says so,
// which needs the FP8 kernels and the varlen (KV-cache) paths.
TEST(Targets, GpuTargetRunsFp8VarlenAndKvCacheAsBuilt) {
  const ValidationTarget t = gpu_target();
  const BuildInfo& build = build_info();
  EXPECT_EQ(t.supports_fp8_varlen && build.gpu_kernels, build.gpu_fp8_varlen);
  if (t.supports_fp8_varlen) {
    EXPECT_TRUE(t.supports_fp8);
    EXPECT_TRUE(t.supports_varlen);
  }
  // Likewise e4m3 KV-cache calls, which need the FP8 and KV-cache paths.
  EXPECT_EQ(t.supports_fp8_kvcache && build.gpu_kernels, build.gpu_fp8_kvcache);
  if (t.supports_fp8_kvcache) EXPECT_TRUE(t.supports_kvcache);
  // FP8 kernels that transpose V in shared memory have TMA read an e4m3 v.
  EXPECT_EQ(t.fp8_v_by_tma && build.gpu_fp8, build.gpu_fp8_vt_smem);
  // KV-cache splits merge in clusters where the build says so.
  EXPECT_EQ(hopper::kvcache_cluster_merge_enabled() && build.gpu_kernels, build.gpu_kvcache_cluster_merge);
}

}  // namespace
}  // namespace fa3::test
