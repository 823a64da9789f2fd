// The KV-cache kernels (fa3::forward_with_kvcache on the GPU) against fa3::cpu on the
// same inputs, under the forward accuracy rule of TESTING.md: `ref` is the CPU path on
// fp32 copies of every input, `low` the CPU path on the inputs themselves. Cases:
// contiguous caches with and without cache_batch_idx, paged caches of page sizes 1, 16
// and 256 in random page order, cache_leftpad, seqlen_q 1, 5 and 128, no mask, causal
// and a window, GQA 32:8, MQA and MHA, head dims 64, 128, 256 and (192, 128), a sequence
// whose seqlen_k is 0, appends crossing page boundaries, rotary in both styles, sinks and
// the softcap, each with num_splits 1, 3, 8, 9 and 0 (the heuristic): with
// FA3_KVCACHE_CLUSTER_MERGE 3 and 8 merge in a cluster, the most it takes, and 9 in the
// merge kernel.
// Guards: out and lse start as NaN, with a NaN margin after each that must stay; cache
// entries no sequence may read hold NaN; the cache after the call (the append) equals
// the CPU path's bit for bit; a repeated call gives bitwise the same out and lse. And
// e4m3 caches with descales (below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/cpu.h"
#include "fa3/fa3.h"
#include "hopper/kvcache.h"
#include "hopper/kvcache_config.h"
#include "reference/host_tensor.h"
#include "reference/kvcache_case.h"

namespace fa3::test {
namespace {

using testing::HostTensor;
using testing::KvCall;
using testing::KvCase;

constexpr std::int64_t kMargin = 64;  // NaN elements after each output

std::int64_t span_of(const HostTensor& t) { return span_elements(const_cast<HostTensor&>(t).view()); }

// A device copy of a host tensor, same layout, with `margin` NaN elements after it.
struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
  std::int64_t span = 0;

  DeviceTensor() = default;
  DeviceTensor(HostTensor& t, std::int64_t margin) : span(span_of(t)) {
    const std::size_t size = dtype_size(t.dtype());
    buffer = DeviceBuffer(static_cast<std::size_t>(span + margin) * size);
    if (margin > 0) fill_nan(buffer.get(), t.dtype(), span + margin);
    EXPECT_EQ(cudaMemcpy(buffer.get(), t.data(), static_cast<std::size_t>(span) * size, cudaMemcpyHostToDevice),
              cudaSuccess);
    view = t.view();
    view.data = buffer.get();
  }
  // The device contents back into `t` (same layout).
  void read_into(HostTensor& t) const {
    EXPECT_EQ(cudaMemcpy(t.data(), buffer.get(), static_cast<std::size_t>(span) * dtype_size(t.dtype()),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  // Elements of the margin that are no longer NaN.
  std::int64_t margin_written(DType dtype) const {
    std::vector<float> all = floats_of_view(dtype);
    std::int64_t n = 0;
    for (std::size_t i = static_cast<std::size_t>(span); i < all.size(); ++i) n += std::isnan(all[i]) ? 0 : 1;
    return n;
  }

 private:
  std::vector<float> floats_of_view(DType dtype) const {
    const std::size_t size = dtype_size(dtype);
    std::vector<std::uint8_t> bytes = buffer.to_host();
    std::vector<float> out(bytes.size() / size);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = numeric::load_as_float(bytes.data(), i, dtype);
    return out;
  }
};

// The same tensor in fp32, same shape (contiguous), values converted exactly.
HostTensor as_fp32(HostTensor& t) {
  const TensorView v = t.view();
  std::vector<std::int64_t> shape(v.shape, v.shape + v.rank);
  HostTensor f(DType::kFloat32, shape);
  testing::Index i{};
  const std::int64_t n1 = v.rank > 1 ? v.shape[1] : 1, n2 = v.rank > 2 ? v.shape[2] : 1,
                     n3 = v.rank > 3 ? v.shape[3] : 1;
  for (i[0] = 0; i[0] < v.shape[0]; ++i[0])
    for (i[1] = 0; i[1] < n1; ++i[1])
      for (i[2] = 0; i[2] < n2; ++i[2])
        for (i[3] = 0; i[3] < n3; ++i[3]) f.set(i, t.get(i));
  return f;
}

// max |a - b|; equal values (infinities included) differ by 0, NaN anywhere by +inf.
double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    if (a[i] == b[i]) continue;
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

// The inputs of a call in fp32: the `ref` side of the accuracy rule.
KvCall fp32_call(KvCall low) {
  KvCall ref = low;
  ref.c.dtype = DType::kFloat32;
  for (HostTensor* t : {&ref.q, &ref.k_cache, &ref.v_cache, &ref.out}) *t = as_fp32(*t);
  if (low.c.seqlen_new > 0) {
    ref.k_new = as_fp32(ref.k_new);
    ref.v_new = as_fp32(ref.v_new);
  }
  if (low.c.rotary_dim > 0) {
    ref.rotary_cos = as_fp32(ref.rotary_cos);
    ref.rotary_sin = as_fp32(ref.rotary_sin);
  }
  return ref;
}

struct GpuCase {
  KvCase kv;
  std::string name() const { return kv.name; }
};

KvCase make(const std::string& name, std::int64_t heads_q, std::int64_t heads_kv, std::int64_t seqlen_q,
            std::int64_t d, std::int64_t dv) {
  KvCase c;
  c.name = name;
  c.nheads_q = heads_q;
  c.nheads_kv = heads_kv;
  c.seqlen_q = seqlen_q;
  c.head_dim = d;
  c.head_dim_v = dv;
  c.dtype = DType::kBFloat16;
  // Lengths across key blocks of 64 and splits, one empty sequence.
  c.capacity = 600;
  c.seqlens = {0, 1, 333, 517};
  return c;
}

std::vector<KvCase> cases() {
  std::vector<KvCase> all;
  all.push_back(make("decode_gqa32_8_contiguous", 32, 8, 1, 128, 128));
  {
    KvCase c = make("decode_gqa32_8_paged1", 32, 8, 1, 128, 128);
    c.page_size = 1;
    all.push_back(c);
  }
  {
    KvCase c = make("decode_mqa_paged16_append", 8, 1, 1, 128, 128);
    c.page_size = 16;
    c.seqlen_new = 1;
    c.seqlens = {0, 15, 333, 511};  // 15 and 511 append across a page boundary
    c.options.causal = true;
    all.push_back(c);
  }
  {
    KvCase c = make("decode_mha_paged256_leftpad", 4, 4, 1, 64, 64);
    c.page_size = 256;
    c.leftpad = {0, 1, 30, 300};
    c.seqlens = {0, 1, 333, 517};
    all.push_back(c);
  }
  {
    KvCase c = make("decode_batch_idx_hdim256_fp16", 16, 8, 1, 256, 256);
    c.dtype = DType::kFloat16;
    c.batch_idx = {5, 0, 3, 1};
    all.push_back(c);
  }
  {
    KvCase c = make("seqlen5_causal_gqa_append_paged16", 32, 8, 5, 128, 128);
    c.page_size = 16;
    c.seqlen_new = 5;
    c.seqlens = {0, 12, 333, 510};
    c.options.causal = true;
    all.push_back(c);
  }
  {
    KvCase c = make("seqlen5_window_hdim192_128", 16, 4, 5, 192, 128);
    c.options.window_left = 40;
    c.options.window_right = 2;
    all.push_back(c);
  }
  {
    KvCase c = make("seqlen128_causal_gqa_leftpad", 32, 8, 128, 128, 128);
    c.leftpad = {0, 0, 7, 100};
    c.seqlens = {0, 1, 333, 517};
    c.options.causal = true;
    all.push_back(c);
  }
  {
    KvCase c = make("seqlen128_prefill_append_paged16_mha", 4, 4, 128, 64, 64);
    c.page_size = 16;
    c.seqlen_new = 128;
    c.capacity = 700;
    c.seqlens = {0, 3, 333, 517};
    c.options.causal = true;
    all.push_back(c);
  }
  {
    KvCase c = make("rotary_interleaved_paged16_causal", 32, 8, 5, 128, 128);
    c.page_size = 16;
    c.seqlen_new = 5;
    c.seqlens = {0, 12, 333, 510};
    c.rotary_dim = 64;
    c.options.causal = true;
    all.push_back(c);
  }
  {
    KvCase c = make("rotary_halves_seqlens_not_causal_fp16", 8, 2, 3, 64, 64);
    c.dtype = DType::kFloat16;
    c.seqlen_new = 2;
    c.rotary_dim = 64;
    c.interleaved = false;
    c.rotary_pos = {0, 9, 100, 7};
    all.push_back(c);
  }
  {
    KvCase c = make("sinks_softcap_chunk_window", 32, 8, 5, 128, 128);
    c.sinks = true;
    c.options.softcap = 5.f;
    c.options.attention_chunk = 96;
    c.options.window_left = 150;
    c.options.window_right = 0;
    all.push_back(c);
  }
  return all;
}

// A KV-cache call's inputs on the device (copies of `low`'s, before the CPU path appends
// to its caches), out and lse NaN with NaN margins, and the workspace the call needs.
struct DeviceCall {
  std::vector<DeviceTensor> inputs;  // q, k_cache, v_cache first (the append's targets: 1, 2)
  DeviceTensor out, lse;
  DeviceBuffer workspace;
  KvCacheArgs args;
  Status sized;  // the workspace query's answer: a build without the case's kernels says so

  DeviceCall(KvCall& low, HostTensor& gpu_out, HostTensor& gpu_lse, int num_splits) {
    inputs.reserve(12);
    auto upload = [&](HostTensor& t) -> TensorView {
      inputs.emplace_back(t, 0);
      return inputs.back().view;
    };
    const KvCacheArgs host_args = low.args();
    args = host_args;
    args.q = upload(low.q);
    args.k_cache = upload(low.k_cache);
    args.v_cache = upload(low.v_cache);
    args.cache_seqlens = upload(low.seqlens);
    if (host_args.page_table.defined()) args.page_table = upload(low.page_table);
    if (host_args.cache_batch_idx.defined()) args.cache_batch_idx = upload(low.batch_idx);
    if (host_args.cache_leftpad.defined()) args.cache_leftpad = upload(low.leftpad);
    if (host_args.k_new.defined()) {
      args.k_new = upload(low.k_new);
      args.v_new = upload(low.v_new);
    }
    if (host_args.rotary_cos.defined()) {
      args.rotary_cos = upload(low.rotary_cos);
      args.rotary_sin = upload(low.rotary_sin);
    }
    if (host_args.rotary_seqlens.defined()) args.rotary_seqlens = upload(low.rotary_pos);
    if (host_args.sinks.defined()) args.sinks = upload(low.sinks);
    out = DeviceTensor(gpu_out, kMargin);
    lse = DeviceTensor(gpu_lse, kMargin);
    args.out = out.view;
    args.lse = lse.view;
    args.num_splits = num_splits;
    std::size_t bytes = 0;
    sized = kvcache_workspace_size(args, &bytes);
    workspace = DeviceBuffer(bytes > 0 ? bytes : 1);
    args.workspace = workspace.get();
    args.workspace_bytes = bytes;
  }

  // Whether the workspace query said that no kernel was built for the case.
  bool unbuilt() const {
    return sized.code() == StatusCode::kNotSupported &&
           (sized.message().find("no GPU KV-cache kernel") != std::string::npos ||
            sized.message().find("is not supported") != std::string::npos);
  }

  // Runs the call twice; the second, on out and lse poisoned again as before the first,
  // must give bitwise the same out and lse (the append writes the same rows again).
  // Reads the first result into gpu_out and gpu_lse.
  void run_twice(HostTensor& gpu_out, HostTensor& gpu_lse, DType out_dtype) {
    const std::vector<std::uint8_t> out_poisoned = out.buffer.to_host(), lse_poisoned = lse.buffer.to_host();
    const Status st = forward_with_kvcache(args, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    out.read_into(gpu_out);
    lse.read_into(gpu_lse);
    EXPECT_EQ(out.margin_written(out_dtype), 0) << "out's margin was written";
    EXPECT_EQ(lse.margin_written(DType::kFloat32), 0) << "lse's margin was written";
    const std::vector<std::uint8_t> out_first = out.buffer.to_host(), lse_first = lse.buffer.to_host();
    for (auto [buffer, bytes] : {std::pair{&out.buffer, &out_poisoned}, std::pair{&lse.buffer, &lse_poisoned}}) {
      FA3_CUDA_CHECK(cudaMemcpy(buffer->get(), bytes->data(), bytes->size(), cudaMemcpyHostToDevice));
    }
    ASSERT_TRUE(forward_with_kvcache(args, nullptr).is_ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(out.buffer.to_host(), out_first) << "a repeated call changed out";
    EXPECT_EQ(lse.buffer.to_host(), lse_first) << "a repeated call changed lse";
  }

  // The caches after the call against the CPU path's after its own (the append), bitwise.
  void expect_caches_equal(const KvCall& low) const {
    HostTensor k_after = low.k_cache, v_after = low.v_cache;
    inputs[1].read_into(k_after);
    inputs[2].read_into(v_after);
    const std::int64_t k_bytes = span_of(k_after) * static_cast<std::int64_t>(dtype_size(low.c.dtype));
    const std::int64_t v_bytes = span_of(v_after) * static_cast<std::int64_t>(dtype_size(low.c.dtype));
    EXPECT_EQ(std::memcmp(k_after.data(), low.k_cache.data(), static_cast<std::size_t>(k_bytes)), 0)
        << "k_cache after the append differs from the CPU path's";
    EXPECT_EQ(std::memcmp(v_after.data(), low.v_cache.data(), static_cast<std::size_t>(v_bytes)), 0)
        << "v_cache after the append differs from the CPU path's";
  }
};

class GpuKvCacheTest : public ::testing::TestWithParam<KvCase> {};

TEST_P(GpuKvCacheTest, MatchesCpuPathForEverySplitCount) {
  FA3_REQUIRE_HOPPER();
  if (!hopper::kvcache_enabled()) GTEST_SKIP() << "the GPU KV-cache path is switched off (FA3_GPU_KVCACHE)";
  const KvCase& c = GetParam();
  for (int num_splits : {1, 3, 8, 9, 0}) {
    SCOPED_TRACE("num_splits " + std::to_string(num_splits));
    KvCall low = testing::make_kv_call(c, 21);
    KvCall ref = fp32_call(low);
    HostTensor gpu_out = low.out, gpu_lse = low.lse;
    DeviceCall call(low, gpu_out, gpu_lse, num_splits);
    if (call.unbuilt()) GTEST_SKIP() << call.sized.message();
    ASSERT_TRUE(call.sized.is_ok()) << call.sized.to_string();
    call.run_twice(gpu_out, gpu_lse, c.dtype);

    const Status low_st = cpu::forward_with_kvcache(low.args());
    ASSERT_TRUE(low_st.is_ok()) << low_st.to_string();
    const Status ref_st = cpu::forward_with_kvcache(ref.args());
    ASSERT_TRUE(ref_st.is_ok()) << ref_st.to_string();

    AccuracyReport r;
    r.out_err = max_diff(gpu_out.values(), ref.out.values());
    r.out_low_err = max_diff(low.out.values(), ref.out.values());
    r.lse_err = max_diff(gpu_lse.values(), ref.lse.values());
    r.lse_low_err = max_diff(low.lse.values(), ref.lse.values());
    EXPECT_TRUE(forward_accurate(r, c.dtype));
    if (c.seqlen_new > 0) call.expect_caches_equal(low);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuKvCacheTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<KvCase>& info) { return info.param.name; });

// The workspace rules on the device: none where one is needed, one byte short.
TEST(GpuKvCacheWorkspace, MissingOrShortIsRefused) {
  FA3_REQUIRE_HOPPER();
  if (!hopper::kvcache_enabled()) GTEST_SKIP() << "the GPU KV-cache path is switched off (FA3_GPU_KVCACHE)";
  KvCase c = make("workspace", 32, 8, 1, 128, 128);
  KvCall call = testing::make_kv_call(c, 5);
  std::vector<DeviceTensor> inputs;
  inputs.reserve(6);
  KvCacheArgs args = call.args();
  for (auto [view, host] : {std::pair{&args.q, &call.q}, std::pair{&args.k_cache, &call.k_cache},
                            std::pair{&args.v_cache, &call.v_cache}, std::pair{&args.cache_seqlens, &call.seqlens},
                            std::pair{&args.out, &call.out}, std::pair{&args.lse, &call.lse}}) {
    inputs.emplace_back(*host, 0);
    *view = inputs.back().view;
  }
  // Splits merged by the merge kernel, whose partial results take the workspace (those of
  // a cluster need none).
  args.num_splits = hopper::kvcache_cluster_merge_enabled() ? hopper::kMaxKvClusterSplits + 1 : 3;
  std::size_t bytes = 0;
  const Status sized = kvcache_workspace_size(args, &bytes);
  if (sized.code() == StatusCode::kNotSupported) GTEST_SKIP() << sized.to_string();
  ASSERT_TRUE(sized.is_ok()) << sized.to_string();
  ASSERT_GT(bytes, 0u);
  const std::vector<std::uint8_t> out_before = inputs[4].buffer.to_host();

  const Status missing = forward_with_kvcache(args, nullptr);
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.message(), "workspace: data pointer is null; this call needs " + std::to_string(bytes) +
                                   " bytes (fa3::kvcache_workspace_size)");
  DeviceBuffer workspace(bytes);
  args.workspace = workspace.get();
  args.workspace_bytes = bytes - 1;
  const Status shorter = forward_with_kvcache(args, nullptr);
  EXPECT_EQ(shorter.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(shorter.message(), "workspace: " + std::to_string(bytes - 1) + " bytes given, " + std::to_string(bytes) +
                                   " needed (fa3::kvcache_workspace_size)");
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(inputs[4].buffer.to_host(), out_before);
}

// e4m3 caches (FA3_GPU_FP8_KVCACHE): q, the caches and the appended rows in e4m3 with a
// descale per (sequence, KV head), out bf16, against fa3::cpu's FP8 path on the same
// codes: ‖out − cpu‖ / ‖cpu‖ within the FP8 rule's 4e-2 (the CPU path rounds P to e4m3,
// the kernel to fp16, both near the exact result), lse within 1e-3 + 1e-4 |lse| (both
// from scores of exact e4m3 products summed in fp32), the appended codes in the cache
// bitwise, repeated calls bitwise, margins untouched.
std::vector<KvCase> fp8_cases() {
  std::vector<KvCase> all;
  all.push_back(make("fp8_decode_gqa32_8_contiguous", 32, 8, 1, 128, 128));
  {
    KvCase c = make("fp8_decode_mqa_paged16_append", 8, 1, 1, 128, 128);
    c.page_size = 16;
    c.seqlen_new = 1;
    c.seqlens = {0, 15, 333, 511};
    c.options.causal = true;
    all.push_back(c);
  }
  {
    KvCase c = make("fp8_seqlen5_causal_gqa_append_paged3", 32, 8, 5, 128, 128);
    c.page_size = 3;
    c.seqlen_new = 5;
    c.seqlens = {0, 12, 333, 510};
    c.options.causal = true;
    all.push_back(c);
  }
  {
    KvCase c = make("fp8_hdim64_leftpad_batch_idx_softcap", 4, 4, 1, 64, 64);
    c.leftpad = {0, 1, 30, 300};
    c.batch_idx = {5, 0, 3, 1};
    c.options.softcap = 5.f;
    all.push_back(c);
  }
  {
    KvCase c = make("fp8_hdim256_paged64_append", 16, 2, 1, 256, 256);
    c.page_size = 64;
    c.seqlen_new = 1;
    all.push_back(c);
  }
  {
    KvCase c = make("fp8_seqlen5_causal_hdim192_128", 16, 4, 5, 192, 128);
    c.options.causal = true;
    all.push_back(c);
  }
  for (KvCase& c : all) c.dtype = DType::kFloat8E4M3;
  return all;
}

double relative_diff(const std::vector<double>& a, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    diff += (a[i] - ref[i]) * (a[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

class GpuFp8KvCacheTest : public ::testing::TestWithParam<KvCase> {};

TEST_P(GpuFp8KvCacheTest, MatchesCpuPathForEverySplitCount) {
  FA3_REQUIRE_HOPPER();
  if (!hopper::kvcache_fp8_enabled()) GTEST_SKIP() << "e4m3 KV-cache calls are off in this build (FA3_GPU_FP8_KVCACHE)";
  const KvCase& c = GetParam();
  // As the 16-bit test: 3 and 8 merge in a cluster where the build does, 9 in the merge
  // kernel; every case has at least 10 key blocks.
  for (int num_splits : {1, 3, 8, 9, 0}) {
    SCOPED_TRACE("num_splits " + std::to_string(num_splits));
    KvCall low = testing::make_kv_call(c, 31);
    low.out = HostTensor(DType::kBFloat16, {c.batch(), c.seqlen_q, c.nheads_q, c.head_dim_v});
    HostTensor descales[3];
    std::mt19937_64 rng(32);
    std::uniform_real_distribution<float> scale(0.25f, 2.f);
    for (HostTensor& d : descales) {
      d = HostTensor(DType::kFloat32, {c.batch(), c.nheads_kv});
      d.for_each([&](const testing::Index& i, std::int64_t) { d.set(i, scale(rng)); });
    }
    HostTensor gpu_out = low.out, gpu_lse = low.lse;
    DeviceCall call(low, gpu_out, gpu_lse, num_splits);
    std::vector<DeviceTensor> scales;
    scales.reserve(3);
    TensorView* views[3] = {&call.args.fp8.q_descale, &call.args.fp8.k_descale, &call.args.fp8.v_descale};
    for (int t = 0; t < 3; ++t) {
      scales.emplace_back(descales[t], 0);
      *views[t] = scales.back().view;
    }
    std::size_t bytes = 0;
    call.sized = kvcache_workspace_size(call.args, &bytes);
    if (call.unbuilt()) GTEST_SKIP() << call.sized.message();
    ASSERT_TRUE(call.sized.is_ok()) << call.sized.to_string();
    call.workspace = DeviceBuffer(bytes > 0 ? bytes : 1);
    call.args.workspace = call.workspace.get();
    call.args.workspace_bytes = bytes;
    call.run_twice(gpu_out, gpu_lse, DType::kBFloat16);

    KvCacheArgs host = low.args();
    host.fp8.q_descale = descales[0].view();
    host.fp8.k_descale = descales[1].view();
    host.fp8.v_descale = descales[2].view();
    const Status cpu_st = cpu::forward_with_kvcache(host);
    ASSERT_TRUE(cpu_st.is_ok()) << cpu_st.to_string();
    EXPECT_LE(relative_diff(gpu_out.values(), low.out.values()), 4e-2);
    const std::vector<double> got_lse = gpu_lse.values(), want_lse = low.lse.values();
    for (std::size_t i = 0; i < got_lse.size(); ++i) {
      if (std::isinf(want_lse[i])) {
        ASSERT_EQ(got_lse[i], want_lse[i]) << "lse " << i;
      } else {
        ASSERT_LE(std::fabs(got_lse[i] - want_lse[i]), 1e-3 + 1e-4 * std::fabs(want_lse[i])) << "lse " << i;
      }
    }
    if (c.seqlen_new > 0) call.expect_caches_equal(low);
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8, GpuFp8KvCacheTest, ::testing::ValuesIn(fp8_cases()),
                         [](const ::testing::TestParamInfo<KvCase>& info) { return info.param.name; });

}  // namespace
}  // namespace fa3::test
