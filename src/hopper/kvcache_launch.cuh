// fa3 — the launch of one KV-cache kernel family (one dtype, or e4m3 with an out dtype,
// and padded head dims), in
// its tile of 16 or 64 rows; instantiated once per family by
// hopper/instantiate/kvcache_instance.cu.in.
#pragma once

#include <cuda_runtime_api.h>

#include <limits>
#include <string>

#include "common/status_macros.h"
#include "hopper/kvcache_config.h"
#include "hopper/kvcache_kernel.cuh"
#include "hopper/kvcache_params.h"
#include "hopper/launch_util.h"

namespace fa3::hopper {

// kFp8: an e4m3 cache, Element the GEMMs' fp16 and ElementOut out's type.
template <class Element, int kHeadDim, int kHeadDimV, int kBlockM, bool kFp8, class ElementOut>
Status launch_kvcache_tile(const KvCacheParams& p, cudaStream_t stream) {
  using Tile = KvCacheTile<kHeadDim, kHeadDimV, kBlockM, kFp8>;
  const auto kernel = kvcache_kernel<Element, kHeadDim, kHeadDimV, kBlockM, kFp8, ElementOut>;
  const long long row_tiles = (static_cast<long long>(p.seqlen_q) * p.group + kBlockM - 1) / kBlockM;
  const long long heads = static_cast<long long>(p.batch) * p.nheads_kv;
  if (row_tiles > 65535 || heads > std::numeric_limits<int>::max()) {
    return {StatusCode::kNotSupported, "q: seqlen_q x (nheads_q / nheads_kv) = " + std::to_string(row_tiles * kBlockM) +
                                           " rows per KV head, or batch x nheads_kv, are more than one launch takes"};
  }
  FA3_RETURN_IF_ERROR(detail::cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Tile::kSmemBytes)),
      "KV-cache kernel shared memory"));
  const dim3 grid(static_cast<unsigned>(heads), static_cast<unsigned>(row_tiles), static_cast<unsigned>(p.num_splits));
  if (p.cluster_merge) {
    // The splits of a tile, consecutive along z, are one cluster.
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = static_cast<unsigned>(p.num_splits);
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = dim3(Tile::kThreads);
    config.dynamicSmemBytes = Tile::kSmemBytes;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    return detail::cuda_status(cudaLaunchKernelEx(&config, kernel, p), "KV-cache kernel launch (one cluster a tile)");
  }
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
  return detail::cuda_status(cudaGetLastError(), "KV-cache kernel launch");
}

template <class Element, int kHeadDim, int kHeadDimV, bool kFp8 = false, class ElementOut = Element>
Status launch_kvcache(const KvCacheParams& p, int block_m, cudaStream_t stream) {
  if (block_m == 16) return launch_kvcache_tile<Element, kHeadDim, kHeadDimV, 16, kFp8, ElementOut>(p, stream);
  return launch_kvcache_tile<Element, kHeadDim, kHeadDimV, 64, kFp8, ElementOut>(p, stream);
}

}  // namespace fa3::hopper
