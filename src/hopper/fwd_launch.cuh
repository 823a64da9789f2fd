// fa3 — host side of the forward kernel: TMA descriptors, grid, shared memory, launch.
// Included only by the generated per-(dtype, head dim, mask, tile) translation units.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "fa3/status.h"
#include "hopper/fwd_config.h"
#include "hopper/fwd_kernel.cuh"
#include "hopper/fwd_params.h"
#include "hopper/fwd_traits.cuh"
#include "hopper/mask.cuh"
#include "hopper/tile_counter.h"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

namespace detail {

// TMA wants every stride a positive multiple of 16 bytes, also for extent-1 modes whose
// stride is never used; give those the stride a packed layout would have.
inline std::int64_t usable_stride(std::int64_t stride, std::int64_t extent, std::int64_t packed) {
  return extent == 1 ? packed : stride;
}

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

}  // namespace detail

template <class Element, int kHeadDim, class Mask, FwdTile kTile>
Status launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using namespace cute;
  constexpr FwdConfig kCfg = fwd_config(kHeadDim, kTile);
  using Traits = FwdTraits<Element, kHeadDim, kCfg>;
  using Kernel = FwdKernel<Traits, Mask>;
  using Stride = typename Traits::GmemStride;
  using StrideVt = typename Traits::GmemStrideVt;

  const std::int64_t d = p.head_dim;
  auto gmem = [](const void* ptr) { return make_gmem_ptr(static_cast<const Element*>(ptr)); };
  auto qo_shape = make_shape(p.seqlen_q, p.head_dim, p.nheads_q, p.batch);
  auto kv_shape = make_shape(p.seqlen_k, p.head_dim, p.nheads_kv, p.batch);
  auto vt_shape = make_shape(p.head_dim, p.seqlen_k, p.nheads_kv, p.batch);
  auto strides = [&](std::int64_t row, std::int64_t head, std::int64_t batch, int rows, int heads) {
    return Stride{detail::usable_stride(row, rows, d), _1{},
                  detail::usable_stride(head, heads, d * rows),
                  detail::usable_stride(batch, p.batch, d * rows * heads)};
  };
  const Stride q_stride = strides(p.q_row_stride, p.q_head_stride, p.q_batch_stride, p.seqlen_q, p.nheads_q);
  const Stride k_stride = strides(p.k_row_stride, p.k_head_stride, p.k_batch_stride, p.seqlen_k, p.nheads_kv);
  const Stride v_stride = strides(p.v_row_stride, p.v_head_stride, p.v_batch_stride, p.seqlen_k, p.nheads_kv);
  const Stride o_stride = strides(p.o_row_stride, p.o_head_stride, p.o_batch_stride, p.seqlen_q, p.nheads_q);
  const StrideVt vt_stride{_1{}, get<0>(v_stride), get<2>(v_stride), get<3>(v_stride)};

  const int num_m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  typename Kernel::Params params{
      make_tma_copy(SM90_TMA_LOAD{}, make_tensor(gmem(p.q), qo_shape, q_stride),
                    take<0, 2>(typename Traits::SmemLayoutQ{}), Shape<typename Traits::BM, typename Traits::D>{},
                    _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, make_tensor(gmem(p.k), kv_shape, k_stride),
                    take<0, 2>(typename Traits::SmemLayoutK{}), Shape<typename Traits::BN, typename Traits::D>{},
                    _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, make_tensor(gmem(p.v), vt_shape, vt_stride),
                    take<0, 2>(typename Traits::SmemLayoutVt{}), Shape<typename Traits::D, typename Traits::BN>{},
                    _1{}),
      make_tma_copy(SM90_TMA_STORE{}, make_tensor(gmem(p.out), qo_shape, o_stride), typename Traits::SmemLayoutO{},
                    Shape<_64, typename Traits::D>{}, _1{}),
      p,
      num_m_blocks,
      Mask::kCausal ? causal_heads_per_group(p, sizeof(Element), Traits::kBlockM, num_m_blocks) : 1,
      nullptr,
  };
  TileCounter counter;

  const std::int64_t tiles = static_cast<std::int64_t>(params.num_m_blocks) * p.nheads_q * p.batch;
  // Tile indices, the scheduler's overshoot past the last one included, are ints.
  if (tiles > INT32_MAX - std::max(p.num_sms, 1)) {
    return {StatusCode::kInvalidArgument, "problem too large: about 2^31 query tiles or more"};
  }
  const int grid = static_cast<int>(std::min<std::int64_t>(tiles, std::max(p.num_sms, 1)));
  auto kernel = fwd_kernel<Kernel>;
  // The attribute is per function and per device; setting it every call costs little
  // next to a launch and stays correct when the caller switches devices.
  Status st = detail::cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes),
      "cudaFuncSetAttribute(max dynamic shared memory)");
  if (!st.is_ok()) return st;
  if constexpr (Kernel::Scheduler::kDynamic) {
    const Status acquired = acquire_tile_counter(stream, &counter);
    if (!acquired.is_ok()) return acquired;
    params.tile_counter = counter.ptr;
  }
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  const Status launched = detail::cuda_status(cudaGetLastError(), "forward kernel launch");
  const Status released = release_tile_counter(counter, stream);
  return launched.is_ok() ? released : launched;
}

}  // namespace fa3::hopper
