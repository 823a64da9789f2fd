// fa3 — forward_with_kvcache on the GPU: the choice of tile, splits and kernel for a
// validated call, the workspace it needs, and the launches (append and rotary, the
// attention kernel, the merge of the splits). Plain C++: the API layer includes this.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "api/validate_kvcache.h"
#include "fa3/kvcache.h"
#include "fa3/status.h"
#include "hopper/kvcache_params.h"

namespace fa3::hopper {

// Whether forward_with_kvcache runs on the GPU: the build's FA3_GPU_KVCACHE option (on
// by default; tests/gpu/hopper/test_kvcache.cpp).
bool kvcache_enabled();

// Whether it runs e4m3 calls too: the build's FA3_GPU_FP8_KVCACHE option (on by default;
// tests/gpu/hopper/test_kvcache.cpp's FP8 cases).
bool kvcache_fp8_enabled();

// Whether calls of 2 to kMaxKvClusterSplits splits merge them inside the kernel, one
// cluster a tile: the build's FA3_KVCACHE_CLUSTER_MERGE option, off (measured slower at
// batch 8: docs/perf-log.md; hopper/kvcache_config.h's kKvClusterMerge).
bool kvcache_cluster_merge_enabled();

// The 16-bit input dtypes and the Q/K head dims of the compiled KV-cache families (e4m3
// ones not included: kvcache_fp8_enabled says whether they run), sorted: what
// forward_with_kvcache's validation accepts, whatever forward kernels the build has.
std::vector<DType> kvcache_dtypes();
std::vector<int> kvcache_head_dims();

// What one call runs and the workspace it needs, all pieces 256-byte aligned: q's
// rotated copy (with a rotary embedding), and with more than one split merged by the
// merge kernel their fp32 results and lse.
struct KvCachePlan {
  int block_m = 64;    // query rows per CTA: 16 or 64
  int num_splits = 1;  // the splits of each sequence's keys
  // The splits merge inside the kernel, those of a tile one cluster (kKvClusterMerge and
  // 2 to kMaxKvClusterSplits splits): no partial results and no merge kernel.
  bool cluster_merge = false;
  int head_dim = 0;    // the kernel's (padded) Q/K and V head dims
  int head_dim_v = 0;
  Status (*launch)(const KvCacheParams&, int block_m, cudaStream_t) = nullptr;
  std::size_t q_rotated_offset = 0;
  std::size_t out_partial_offset = 0;
  std::size_t lse_partial_offset = 0;
  std::size_t bytes = 0;
};

// The plan for `problem` with inputs of `dtype` on a device of `num_sms` SMs, for
// num_splits as the caller gave it (0: chosen here). kNotSupported when no kernel was
// built for the head dims.
Status plan_kvcache(const KvCacheProblem& problem, DType dtype, int num_splits, int num_sms, KvCachePlan* plan);

// Enqueues the call on `stream`: `args` passed validate_kvcache for the device and the
// workspace holds plan.bytes. kNotSupported, before anything is enqueued, for addresses
// or strides the kernels' 16-byte accesses cannot take.
Status run_kvcache(const KvCacheProblem& problem, const KvCacheArgs& args, const KvCachePlan& plan,
                   cudaStream_t stream);

}  // namespace fa3::hopper
