// With the GPU KV-cache path switched off (FA3_GPU_KVCACHE; with it on,
// tests/gpu/hopper/test_kvcache.cpp runs the calls), the GPU entry point refuses a
// KV-cache call whose arguments are otherwise valid and in device memory with
// kNotSupported naming k_cache, and writes nothing: no output, and nothing appended to
// the cache (fa3::cpu runs it). The combine runs on the GPU
// (tests/gpu/hopper/test_merge.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/fa3.h"
#include "hopper/fwd_dispatch.h"
#include "hopper/kvcache.h"

namespace fa3::test {
namespace {

// Two sequences of one query each over a contiguous cache of 16 positions with 3 and 5
// valid entries, one new row each to append; 4 query heads on 2. Every output and the
// cache NaN before the call.
struct DeviceKvCache {
  static constexpr std::int64_t kBatch = 2, kCapacity = 16, kHeadsQ = 4, kHeadsKv = 2;
  DType dtype;
  std::int64_t head_dim;
  DeviceBuffer q, k_cache, v_cache, k_new, v_new, out, lse, seqlens;

  DeviceKvCache(DType dt, std::int64_t d)
      : dtype(dt),
        head_dim(d),
        q(rows(1, kHeadsQ)),
        k_cache(rows(kCapacity, kHeadsKv)),
        v_cache(rows(kCapacity, kHeadsKv)),
        k_new(rows(1, kHeadsKv)),
        v_new(rows(1, kHeadsKv)),
        out(rows(1, kHeadsQ)),
        lse(kBatch * kHeadsQ * sizeof(float)),
        seqlens(kBatch * sizeof(std::int32_t)) {
    const std::int32_t lengths[] = {3, 5};
    EXPECT_EQ(cudaMemcpy(seqlens.get(), lengths, sizeof lengths, cudaMemcpyHostToDevice), cudaSuccess);
    for (DeviceBuffer* b : {&out, &k_cache, &v_cache}) fill_nan(b->get(), dtype, elements(*b));
    fill_nan(lse.get(), DType::kFloat32, kBatch * kHeadsQ);
  }

  std::size_t rows(std::int64_t seqlen, std::int64_t heads) const {
    return static_cast<std::size_t>(kBatch * seqlen * heads * head_dim) * dtype_size(dtype);
  }
  std::int64_t elements(const DeviceBuffer& b) const {
    return static_cast<std::int64_t>(b.bytes() / dtype_size(dtype));
  }
  TensorView view(const DeviceBuffer& b, std::int64_t seqlen, std::int64_t heads) const {
    return TensorView::contiguous(b.get(), dtype, {kBatch, seqlen, heads, head_dim});
  }

  KvCacheArgs args() const {
    KvCacheArgs a;
    a.q = view(q, 1, kHeadsQ);
    a.k_cache = view(k_cache, kCapacity, kHeadsKv);
    a.v_cache = view(v_cache, kCapacity, kHeadsKv);
    a.k_new = view(k_new, 1, kHeadsKv);
    a.v_new = view(v_new, 1, kHeadsKv);
    a.cache_seqlens = TensorView::contiguous(seqlens.get(), DType::kInt32, {kBatch});
    a.out = view(out, 1, kHeadsQ);
    a.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {kBatch, kHeadsQ, 1});
    return a;
  }
};

TEST(GpuKvCache, ForwardRefusesAndWritesNothing) {
  FA3_REQUIRE_HOPPER();
  if (hopper::kvcache_enabled()) GTEST_SKIP() << "the GPU KV-cache path is switched on (FA3_GPU_KVCACHE)";
  if (hopper::fwd_dtypes().empty()) GTEST_SKIP() << "no forward kernels were built";
  DeviceKvCache d(hopper::fwd_dtypes().front(), hopper::fwd_head_dims().front());
  const std::vector<std::uint8_t> out_before = d.out.to_host(), lse_before = d.lse.to_host();
  const std::vector<std::uint8_t> k_before = d.k_cache.to_host(), v_before = d.v_cache.to_host();
  const Status s = forward_with_kvcache(d.args(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.to_string();
  EXPECT_EQ(s.message(), "k_cache: KV-cache attention is not implemented on the GPU yet");
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d.out.to_host(), out_before);
  EXPECT_EQ(d.lse.to_host(), lse_before);
  EXPECT_EQ(d.k_cache.to_host(), k_before);
  EXPECT_EQ(d.v_cache.to_host(), v_before);
}

}  // namespace
}  // namespace fa3::test
