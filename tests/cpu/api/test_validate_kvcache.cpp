// The rules of KV-cache and combine calls, broken one at a time from valid calls through
// fa3::cpu: each gives its status and whole message, and a rejected call writes nothing —
// out and lse keep their NaN and the caches their contents (no append). The GPU entry
// point of KV-cache calls refuses them after every rule where the GPU path is switched
// off, and where it is on checks the caller's workspace (missing, short, misaligned, in
// the wrong place) after every other rule; a combine on a device target checks where each
// tensor lives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "../reference/kvcache_case.h"
#include "api/validate.h"
#include "api/validate_kvcache.h"
#include "fa3/cpu.h"
#include "hopper/kvcache.h"

namespace fa3::testing {
namespace {

const StatusCode kInvalid = StatusCode::kInvalidArgument;

KvCase contiguous_case() {
  KvCase c;
  c.seqlens = {5, 0, 17, 40};
  c.batch_idx = {3, 0, 5, 1};
  c.leftpad = {1, 0, 2, 3};
  c.seqlen_q = 2;
  c.seqlen_new = 2;
  c.rotary_dim = 8;
  c.options.causal = true;
  return c;
}

KvCase paged_case() {
  KvCase c = contiguous_case();
  c.batch_idx.clear();
  c.page_size = 16;
  return c;
}

std::int32_t* int32s(HostTensor& t) { return static_cast<std::int32_t*>(t.data()); }

struct KvRule {
  std::string name;
  bool paged;
  std::function<void(KvCall&, KvCacheArgs&)> breaks;
  StatusCode code;
  std::string message;
};

void PrintTo(const KvRule& r, std::ostream* os) { *os << r.name; }

std::vector<KvRule> kv_rules() {
  return {
      {"k_cache_rank", false, [](KvCall&, KvCacheArgs& a) { a.k_cache.rank = 3; }, kInvalid,
       "k_cache: expected a 4-d tensor (batch_cache, seqlen_cache, nheads_kv, head_dim), got rank 3"},
      {"k_cache_null", true, [](KvCall&, KvCacheArgs& a) { a.k_cache.data = nullptr; }, kInvalid,
       "k_cache: data pointer is null"},
      {"v_cache_dtype", false, [](KvCall&, KvCacheArgs& a) { a.v_cache.dtype = DType::kFloat16; }, kInvalid,
       "v_cache: dtype fp16 does not match q's dtype bf16"},
      {"v_cache_shape", true, [](KvCall&, KvCacheArgs& a) { a.v_cache.shape[1] = 8; }, kInvalid,
       "v_cache: shape (18, 8, 2, 32) must match k_cache's shape (18, 16, 2, 32) except in the last dimension"},
      {"k_cache_head_dim", false, [](KvCall&, KvCacheArgs& a) { a.k_cache.shape[3] = 16; }, kInvalid,
       "k_cache: head dim 16 does not match q's head dim 32"},
      {"k_cache_nheads", false,
       [](KvCall&, KvCacheArgs& a) {
         a.k_cache.shape[2] = 3;
         a.v_cache.shape[2] = 3;
       },
       kInvalid, "q: nheads 4 is not a multiple of k_cache's nheads 3"},
      {"out_shape", false, [](KvCall&, KvCacheArgs& a) { a.out.shape[1] = 3; }, kInvalid,
       "out: shape (4, 3, 4, 32) must be (batch, seqlen_q, nheads_q, head_dim_v) = (4, 2, 4, 32)"},
      {"cache_seqlens_dtype", false, [](KvCall&, KvCacheArgs& a) { a.cache_seqlens.dtype = DType::kFloat32; }, kInvalid,
       "cache_seqlens: dtype must be int32, got fp32"},
      {"cache_seqlens_batch", false, [](KvCall&, KvCacheArgs& a) { a.cache_seqlens.shape[0] = 3; }, kInvalid,
       "cache_seqlens: shape (3) must have q's batch 4 first"},
      {"cache_seqlens_missing", false, [](KvCall&, KvCacheArgs& a) { a.cache_seqlens = TensorView{}; }, kInvalid,
       "cache_seqlens: data pointer is null"},
      {"page_table_dtype", true, [](KvCall&, KvCacheArgs& a) { a.page_table.dtype = DType::kFloat32; }, kInvalid,
       "page_table: dtype must be int32, got fp32"},
      {"paged_with_batch_idx", true, [](KvCall& k, KvCacheArgs& a) { a.cache_batch_idx = k.seqlens.view(); }, kInvalid,
       "cache_batch_idx: not supported with a paged cache (page_table); order the page table instead"},
      {"batch_cache_without_idx", false, [](KvCall&, KvCacheArgs& a) { a.cache_batch_idx = TensorView{}; }, kInvalid,
       "k_cache: batch_cache 7 must equal q's batch 4 when cache_batch_idx is not given"},
      {"cache_leftpad_rank", false, [](KvCall&, KvCacheArgs& a) { a.cache_leftpad.rank = 2; }, kInvalid,
       "cache_leftpad: expected a 1-d tensor (batch), got rank 2"},
      {"v_new_missing", false, [](KvCall&, KvCacheArgs& a) { a.v_new = TensorView{}; }, kInvalid,
       "v_new: must be given with k_new"},
      {"k_new_shape", false, [](KvCall&, KvCacheArgs& a) { a.k_new.shape[2] = 1; }, kInvalid,
       "k_new: shape (4, 2, 1, 32) must be (batch, seqlen_new, nheads_kv, head_dim) = (4, 2, 2, 32)"},
      {"v_new_seqlen", false, [](KvCall&, KvCacheArgs& a) { a.v_new.shape[1] = 1; }, kInvalid,
       "v_new: shape (4, 1, 2, 32) must be (batch, seqlen_new, nheads_kv, head_dim_v) = (4, 2, 2, 32)"},
      {"k_new_dtype", false, [](KvCall&, KvCacheArgs& a) { a.k_new.dtype = DType::kFloat32; }, kInvalid,
       "k_new: dtype fp32 does not match q's dtype bf16"},
      {"rotary_sin_missing", false, [](KvCall&, KvCacheArgs& a) { a.rotary_sin = TensorView{}; }, kInvalid,
       "rotary_sin: must be given with rotary_cos"},
      {"rotary_without_append", false,
       [](KvCall&, KvCacheArgs& a) {
         a.k_new = TensorView{};
         a.v_new = TensorView{};
       },
       kInvalid, "rotary_cos: a rotary embedding needs k_new and v_new to append"},
      {"rotary_dim_too_large", false,
       [](KvCall&, KvCacheArgs& a) {
         a.rotary_cos.shape[1] = 17;
         a.rotary_sin.shape[1] = 17;
       },
       kInvalid, "rotary_cos: rotary_dim 2 * 17 = 34 exceeds q's head dim 32"},
      {"rotary_sin_shape", false, [](KvCall&, KvCacheArgs& a) { a.rotary_sin.shape[0] = 5; }, kInvalid,
       "rotary_sin: shape (5, 4) must equal rotary_cos's shape (66, 4)"},
      {"rotary_cos_dtype", false, [](KvCall&, KvCacheArgs& a) { a.rotary_cos.dtype = DType::kFloat16; }, kInvalid,
       "rotary_cos: dtype fp16 does not match q's dtype bf16"},
      {"rotary_seqlens_alone", false,
       [](KvCall& k, KvCacheArgs& a) {
         a.rotary_cos = TensorView{};
         a.rotary_sin = TensorView{};
         a.rotary_seqlens = k.seqlens.view();
       },
       kInvalid, "rotary_seqlens: given without rotary_cos and rotary_sin"},
      {"num_splits_negative", false, [](KvCall&, KvCacheArgs& a) { a.num_splits = -1; }, kInvalid,
       "num_splits must be >= 0 (0: chosen by a heuristic), got -1"},
      {"softcap_negative", true, [](KvCall&, KvCacheArgs& a) { a.options.softcap = -1.f; }, kInvalid,
       "softcap must be finite and >= 0 (0: off), got -1"},
      // Values, read on the host.
      {"cache_seqlens_negative", false, [](KvCall& k, KvCacheArgs&) { int32s(k.seqlens)[2] = -1; }, kInvalid,
       "cache_seqlens: cache_seqlens[2] = -1 must be >= 0"},
      {"cache_too_small", true, [](KvCall& k, KvCacheArgs&) { int32s(k.seqlens)[3] = 63; }, kInvalid,
       "cache_seqlens: cache_seqlens[3] + seqlen_new = 63 + 2 exceeds the cache's 64 positions per sequence"},
      {"cache_leftpad_past_seqlen", false, [](KvCall& k, KvCacheArgs&) { int32s(k.leftpad)[0] = 6; }, kInvalid,
       "cache_leftpad: cache_leftpad[0] = 6 is outside [0, cache_seqlens[0] = 5]"},
      {"cache_batch_idx_range", false, [](KvCall& k, KvCacheArgs&) { int32s(k.batch_idx)[1] = 7; }, kInvalid,
       "cache_batch_idx: cache_batch_idx[1] = 7 is outside [0, 7), k_cache's rows"},
      {"page_table_range", true, [](KvCall& k, KvCacheArgs&) { int32s(k.page_table)[2 * 4 + 1] = 18; }, kInvalid,
       "page_table: page_table[2][1] = 18 is outside [0, 18), k_cache's pages"},
      {"page_table_negative", true, [](KvCall& k, KvCacheArgs&) { int32s(k.page_table)[0] = -1; }, kInvalid,
       "page_table: page_table[0][0] = -1 is outside [0, 18), k_cache's pages"},
      {"rotary_table_too_short", false,
       [](KvCall&, KvCacheArgs& a) {
         a.rotary_cos.shape[0] = 10;
         a.rotary_sin.shape[0] = 10;
       },
       kInvalid, "rotary_cos: position 18 of sequence 2 is past its 10 rows (seqlen_ro)"},
  };
}

// Element-wise equal, NaN equal to NaN.
bool same_values(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t n = 0; n < a.size(); ++n) {
    if (!(a[n] == b[n] || (std::isnan(a[n]) && std::isnan(b[n])))) return false;
  }
  return true;
}

bool all_nan(const HostTensor& t) {
  for (double v : t.values()) {
    if (!std::isnan(v)) return false;
  }
  return true;
}

class KvCacheRule : public ::testing::TestWithParam<KvRule> {};

TEST_P(KvCacheRule, RejectsAndWritesNothing) {
  const KvRule& rule = GetParam();
  KvCall call = make_kv_call(rule.paged ? paged_case() : contiguous_case(), 5);
  KvCacheArgs args = call.args();
  ASSERT_TRUE(cpu::forward_with_kvcache(args).is_ok()) << "the unbroken call must be valid";
  call = make_kv_call(rule.paged ? paged_case() : contiguous_case(), 5);
  args = call.args();
  rule.breaks(call, args);
  const std::vector<double> k_before = call.k_cache.values(), v_before = call.v_cache.values();
  const Status st = cpu::forward_with_kvcache(args);
  EXPECT_EQ(st.code(), rule.code);
  EXPECT_EQ(st.message(), rule.message);
  EXPECT_TRUE(all_nan(call.out));
  EXPECT_TRUE(all_nan(call.lse));
  EXPECT_TRUE(same_values(call.k_cache.values(), k_before)) << "k_cache was written";
  EXPECT_TRUE(same_values(call.v_cache.values(), v_before)) << "v_cache was written";
}

INSTANTIATE_TEST_SUITE_P(Rules, KvCacheRule, ::testing::ValuesIn(kv_rules()),
                         [](const ::testing::TestParamInfo<KvRule>& info) { return info.param.name; });

// The GPU's refusal, on a device-like target that checks no pointer (no GPU here).
TEST(KvCacheRule, DeviceTargetRefusesAfterEveryRule) {
  KvCall call = make_kv_call(paged_case(), 5);
  ValidationTarget device = cpu_target();
  device.space = ValidationTarget::Space::kDevice;
  KvCacheProblem problem;
  KvCacheArgs args = call.args();
  Status st = validate_kvcache(args, device, &problem);
  EXPECT_EQ(st.code(), StatusCode::kNotSupported);
  EXPECT_EQ(st.message(), "k_cache: KV-cache attention is not implemented on the GPU yet");
  args.num_splits = -2;
  st = validate_kvcache(args, device, &problem);
  EXPECT_EQ(st.code(), kInvalid) << "a broken rule is reported before the refusal";
}

// A device target that runs KV-cache calls and asks a fixed workspace (none for a call of
// one split), so that the workspace rules are testable without a GPU. `elsewhere`, when
// set, is a pointer its `locate` reports as host memory.
constexpr std::size_t kWorkspaceBytes = 4096;

ValidationTarget kvcache_target(const void* elsewhere = nullptr) {
  ValidationTarget t = cpu_target();
  t.space = ValidationTarget::Space::kDevice;
  t.supports_kvcache = true;
  t.kvcache_workspace = [](const KvCacheProblem&, DType, int num_splits, std::size_t* bytes) {
    *bytes = num_splits == 1 ? 0 : kWorkspaceBytes;
    return Status::ok();
  };
  t.locate = [elsewhere](const void* p) { return p == elsewhere ? std::string("host memory") : std::string(); };
  return t;
}

TEST(KvCacheWorkspace, DeviceTargetChecksTheWorkspaceAfterEveryRule) {
  KvCall call = make_kv_call(paged_case(), 5);
  alignas(256) static std::uint8_t buffer[2 * kWorkspaceBytes];
  KvCacheProblem problem;
  KvCacheArgs args = call.args();
  args.num_splits = 3;
  Status st = validate_kvcache(args, kvcache_target(), &problem);
  EXPECT_EQ(st.code(), kInvalid);
  EXPECT_EQ(st.message(), "workspace: data pointer is null; this call needs 4096 bytes (fa3::kvcache_workspace_size)");

  args.workspace = buffer;
  args.workspace_bytes = kWorkspaceBytes - 1;
  st = validate_kvcache(args, kvcache_target(), &problem);
  EXPECT_EQ(st.code(), kInvalid);
  EXPECT_EQ(st.message(), "workspace: 4095 bytes given, 4096 needed (fa3::kvcache_workspace_size)");

  args.workspace = buffer + 16;
  args.workspace_bytes = kWorkspaceBytes;
  st = validate_kvcache(args, kvcache_target(), &problem);
  EXPECT_EQ(st.code(), kInvalid);
  EXPECT_EQ(st.message(), "workspace: data pointer is not 256-byte aligned");

  args.workspace = buffer;
  st = validate_kvcache(args, kvcache_target(buffer), &problem);
  EXPECT_EQ(st.code(), kInvalid);
  EXPECT_EQ(st.message(), "workspace: pointer is host memory, not memory of the current CUDA device");

  st = validate_kvcache(args, kvcache_target(), &problem);
  EXPECT_TRUE(st.is_ok()) << st.to_string();

  // A broken rule is reported before the workspace.
  args.workspace = nullptr;
  args.num_splits = -2;
  st = validate_kvcache(args, kvcache_target(), &problem);
  EXPECT_EQ(st.message(), "num_splits must be >= 0 (0: chosen by a heuristic), got -2");

  // A call that needs none takes none.
  args.num_splits = 1;
  args.workspace_bytes = 0;
  st = validate_kvcache(args, kvcache_target(), &problem);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

// KV-cache calls are validated against the KV-cache kernels' dtypes and head dims, not
// the forward kernels': a build of KV-cache kernels alone runs them (it refused every call
// as "no GPU kernels were built" when it took the forward's lists).
TEST(KvCacheWorkspace, DeviceTargetListsTheKvCacheKernels) {
  const ValidationTarget t = gpu_kvcache_target();
  EXPECT_EQ(t.dtypes, hopper::kvcache_dtypes());
  EXPECT_EQ(t.head_dims, hopper::kvcache_head_dims());
  EXPECT_TRUE(std::is_sorted(t.head_dims.begin(), t.head_dims.end()));
}

struct CombineCall {
  HostTensor out_partial{DType::kFloat32, {2, 5, 3, 8}};
  HostTensor lse_partial{DType::kFloat32, {2, 5, 3}};
  HostTensor out{DType::kBFloat16, {5, 3, 8}};
  HostTensor lse{DType::kFloat32, {5, 3}};

  CombineCall() {
    std::mt19937_64 rng(3);
    out_partial.fill_normal(rng);
    lse_partial.fill_normal(rng);
  }

  CombineArgs args() {
    CombineArgs a;
    a.out_partial = out_partial.view();
    a.lse_partial = lse_partial.view();
    a.out = out.view();
    a.lse = lse.view();
    return a;
  }
};

struct CombineRule {
  std::string name;
  std::function<void(CombineArgs&)> breaks;
  std::string message;
};

void PrintTo(const CombineRule& r, std::ostream* os) { *os << r.name; }

class CombineRuleTest : public ::testing::TestWithParam<CombineRule> {};

TEST_P(CombineRuleTest, RejectsAndWritesNothing) {
  CombineCall call;
  CombineArgs args = call.args();
  GetParam().breaks(args);
  const Status st = cpu::combine(args);
  EXPECT_EQ(st.code(), kInvalid);
  EXPECT_EQ(st.message(), GetParam().message);
  EXPECT_TRUE(all_nan(call.out));
  EXPECT_TRUE(all_nan(call.lse));
}

INSTANTIATE_TEST_SUITE_P(
    Rules, CombineRuleTest,
    ::testing::Values(
        CombineRule{"out_partial_rank", [](CombineArgs& a) { a.out_partial.rank = 3; },
                    "out_partial: expected a 4-d tensor (num_splits, rows, nheads, head_dim), got rank 3"},
        CombineRule{"out_partial_dtype", [](CombineArgs& a) { a.out_partial.dtype = DType::kBFloat16; },
                    "out_partial: dtype bf16 does not match the required fp32"},
        CombineRule{"lse_partial_dtype", [](CombineArgs& a) { a.lse_partial.dtype = DType::kFloat16; },
                    "lse_partial: dtype fp16 does not match the required fp32"},
        CombineRule{"lse_partial_shape", [](CombineArgs& a) { a.lse_partial.shape[2] = 2; },
                    "lse_partial: shape (2, 5, 2) must be (num_splits, rows, nheads) = (2, 5, 3), as out_partial's"},
        CombineRule{"out_shape", [](CombineArgs& a) { a.out.shape[2] = 4; },
                    "out: shape (5, 3, 4) must be (rows, nheads, head_dim) = (5, 3, 8)"},
        CombineRule{"out_dtype", [](CombineArgs& a) { a.out.dtype = DType::kInt32; },
                    "out: dtype must be fp32, fp16 or bf16, got int32"},
        CombineRule{"lse_shape", [](CombineArgs& a) { a.lse.shape[0] = 4; },
                    "lse: shape (4, 3) must be (rows, nheads) = (5, 3)"},
        CombineRule{"lse_dtype", [](CombineArgs& a) { a.lse.dtype = DType::kFloat16; },
                    "lse: dtype fp16 does not match the required fp32"}),
    [](const ::testing::TestParamInfo<CombineRule>& info) { return info.param.name; });

// On a device target every tensor must be memory of the current device: each one that
// is not is named, and a call whose tensors all are passes.
TEST(CombineRuleTest, DeviceTargetChecksWhereEachTensorLives) {
  CombineCall call;
  const CombineArgs base = call.args();
  const std::pair<const char*, const void*> tensors[] = {{"out_partial", base.out_partial.data},
                                                         {"lse_partial", base.lse_partial.data},
                                                         {"out", base.out.data},
                                                         {"lse", base.lse.data}};
  for (const auto& [name, host] : tensors) {
    ValidationTarget device;
    device.space = ValidationTarget::Space::kDevice;
    device.locate = [host = host](const void* p) { return p == host ? std::string("host memory") : std::string(); };
    CombineProblem problem;
    const Status st = validate_combine(base, device, &problem);
    EXPECT_EQ(st.code(), kInvalid) << name;
    EXPECT_EQ(st.message(), std::string(name) + ": pointer is host memory, not memory of the current CUDA device");
  }
  ValidationTarget device;
  device.space = ValidationTarget::Space::kDevice;
  device.locate = [](const void*) { return std::string(); };
  CombineProblem problem;
  const Status st = validate_combine(base, device, &problem);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(problem.num_splits, 2);
  EXPECT_EQ(problem.rows, 5);
  EXPECT_EQ(problem.nheads, 3);
  EXPECT_EQ(problem.head_dim, 8);
}

}  // namespace
}  // namespace fa3::testing
