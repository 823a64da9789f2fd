// fa3 — host side of the forward kernel: TMA descriptors, grid, shared memory, launch.
// Included only by the generated per-(dtype, head dim, mask, tile) translation units.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "fa3/status.h"
#include "hopper/fwd_config.h"
#include "hopper/fwd_kernel.cuh"
#include "hopper/fwd_params.h"
#include "hopper/fwd_traits.cuh"
#include "hopper/launch_util.h"
#include "hopper/mask.cuh"
#include "hopper/tile_counter.h"
#include "hopper/tile_scheduler.cuh"
#include "hopper/timeline_capture.h"

namespace fa3::hopper {

namespace detail {

// How many clusters of `config` can be resident at once on the current device: not
// always the SM count over the cluster size, since a cluster's CTAs must share a GPC.
// Asked once per kernel and device (the answer does not change) and then remembered.
template <class KernelFn>
Status max_active_clusters(KernelFn kernel, const cudaLaunchConfig_t& config, int* clusters) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};
  int device = 0;
  const Status got_device = cuda_status(cudaGetDevice(&device), "cudaGetDevice");
  if (!got_device.is_ok()) return got_device;
  const bool cached = device < kMaxDevices && known[device].load(std::memory_order_relaxed) > 0;
  if (cached) {
    *clusters = known[device].load(std::memory_order_relaxed);
    return Status::ok();
  }
  const Status asked =
      cuda_status(cudaOccupancyMaxActiveClusters(clusters, kernel, &config), "cudaOccupancyMaxActiveClusters");
  if (!asked.is_ok()) return asked;
  if (*clusters <= 0) return {StatusCode::kCudaError, "the forward kernel's cluster does not fit on this GPU"};
  if (device < kMaxDevices) known[device].store(*clusters, std::memory_order_relaxed);
  return Status::ok();
}

}  // namespace detail

// ElementOut is O's type: Element, or bf16 / fp16 for e4m3 inputs (whose V the kernel
// reads from p.vt, the transposed copy hopper/fp8_vt.h writes, or with the transpose in
// shared memory from p.v).
template <class Element, int kHeadDim, int kHeadDimV, class Mask, FwdTile kTile, class ElementOut = Element>
Status launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using namespace cute;
  constexpr FwdConfig kCfg = [] {
    FwdConfig c = fwd_config(kHeadDim, kHeadDimV, kTile, sizeof_bits_v<Element> / 8);
    c.varlen = fwd_carries_varlen(kHeadDim, Mask::kGeneral, sizeof_bits_v<Element> == 8);
    return c;
  }();
  static_assert(kCfg.cluster_m == 1 || !Mask::kCausal, "causal query blocks differ in key blocks: no shared loads");
  using Traits = FwdTraits<Element, kHeadDim, kHeadDimV, kCfg, ElementOut>;
  using Kernel = FwdKernel<Traits, Mask>;
  using Stride = typename Traits::GmemStride;
  using StrideVt = typename Traits::GmemStrideVt;

  auto gmem = [](const void* ptr) { return make_gmem_ptr(static_cast<const Element*>(ptr)); };
  auto gmem_out = [](void* ptr) { return make_gmem_ptr(static_cast<const ElementOut*>(ptr)); };
  // The tensors' head dim is the call's: TMA reads the kernel's extra columns as zeros
  // and stores none of them. A varlen call's packed tensors are one batch entry of all
  // their rows (q_rows, k_rows, tensor_batches in hopper/tile_scheduler.cuh), which the
  // kernel offsets to each sequence's first row; its O is never stored by TMA.
  const int rows_q = q_rows<kCfg.varlen>(p);
  const int rows_k = k_rows<kCfg.varlen>(p);
  const int batches = tensor_batches<kCfg.varlen>(p);
  auto q_shape = make_shape(rows_q, p.head_dim, p.nheads_q, batches);
  auto k_shape = make_shape(rows_k, p.head_dim, p.nheads_kv, batches);
  auto vt_shape = make_shape(p.head_dim_v, rows_k, p.nheads_kv, batches);
  auto o_shape = make_shape(rows_q, p.head_dim_v, p.nheads_q, batches);
  auto strides = [&](std::int64_t row, std::int64_t head, std::int64_t batch, int rows, int heads, int head_dim) {
    const std::int64_t row_stride = detail::usable_stride(row, rows, detail::padded_row<Element>(head_dim));
    const std::int64_t head_stride = detail::usable_stride(head, heads, row_stride * rows);
    return Stride{row_stride, _1{}, head_stride, detail::usable_stride(batch, batches, head_stride * heads)};
  };
  const Stride q_stride = strides(p.q_row_stride, p.q_head_stride, p.q_batch_stride, rows_q, p.nheads_q, p.head_dim);
  const Stride k_stride = strides(p.k_row_stride, p.k_head_stride, p.k_batch_stride, rows_k, p.nheads_kv, p.head_dim);
  const Stride v_stride = strides(p.v_row_stride, p.v_head_stride, p.v_batch_stride, rows_k, p.nheads_kv, p.head_dim_v);
  const Stride o_stride = strides(p.o_row_stride, p.o_head_stride, p.o_batch_stride, rows_q, p.nheads_q, p.head_dim_v);
  // With the transpose in shared memory, an e4m3 V is read by TMA as it is: its head dim
  // contiguous (tma_v_rows, rows like K's) or its keys (tma_v, as Vᵀ). Both descriptors
  // are made from the call's V, the one its layout does not use over the same memory with
  // the two inner modes' roles exchanged (valid strides, never loaded).
  const bool v_keys_contiguous = p.v_col_stride != 1;
  const auto v_as = [&](int extent0, int extent1, std::int64_t stride0) {
    return make_tensor(gmem(p.v), make_shape(extent0, extent1, p.nheads_kv, batches),
                       strides(stride0, p.v_head_stride, p.v_batch_stride, extent0, p.nheads_kv, extent1));
  };
  const auto v_tensor = [&] {
    if constexpr (Traits::kVtSmem) {
      // (head_dim_v, keys), keys contiguous.
      return v_keys_contiguous ? v_as(p.head_dim_v, rows_k, p.v_col_stride)
                               : v_as(rows_k, p.head_dim_v, p.v_row_stride);
    } else if constexpr (Traits::kFp8) {
      // Vᵀ: (head_dim_v, vt_keys) per (kv head, batch), dense, keys contiguous.
      const std::int64_t keys = p.vt_keys;
      const Stride vt{keys, _1{}, keys * p.head_dim_v, keys * p.head_dim_v * p.nheads_kv};
      return make_tensor(gmem(p.vt), make_shape(p.head_dim_v, p.vt_keys, p.nheads_kv, batches), vt);
    } else {
      const StrideVt vt_stride{_1{}, get<0>(v_stride), get<2>(v_stride), get<3>(v_stride)};
      return make_tensor(gmem(p.v), vt_shape, vt_stride);
    }
  };

  // The CTAs of a cluster run neighbouring query blocks of one head: each head gets a
  // multiple of the cluster size, the blocks past the sequence end computed and not
  // stored (their Q loads read zeros, their O stores and LSE writes are cut off).
  constexpr int kCluster = Traits::kCluster;
  const int num_m_blocks = (p.seqlen_q + Traits::kBlockM * kCluster - 1) / (Traits::kBlockM * kCluster) * kCluster;
  typename Kernel::Params params{
      make_tma_copy(SM90_TMA_LOAD{}, make_tensor(gmem(p.q), q_shape, q_stride),
                    take<0, 2>(typename Traits::SmemLayoutQ{}), Shape<typename Traits::BM, typename Traits::D>{},
                    _1{}),
      make_tma_copy(typename Traits::TmaKVOp{}, make_tensor(gmem(p.k), k_shape, k_stride),
                    take<0, 2>(typename Traits::SmemLayoutK{}), Shape<typename Traits::BN, typename Traits::D>{},
                    typename Traits::Cluster{}),
      make_tma_copy(typename Traits::TmaKVOp{}, v_tensor(), take<0, 2>(typename Traits::SmemLayoutVt{}),
                    Shape<typename Traits::DV, typename Traits::BN>{}, typename Traits::Cluster{}),
      make_tma_copy(SM90_TMA_STORE{}, make_tensor(gmem_out(p.out), o_shape, o_stride), typename Traits::SmemLayoutO{},
                    Shape<_64, typename Traits::DV>{}, _1{}),
      p,
      num_m_blocks,
      Kernel::Scheduler::kDynamic ? causal_heads_per_group(p, sizeof(Element), Traits::kBlockM, num_m_blocks) : 1,
      nullptr,
      fwd_draw_lead(Traits::kHeadDim, p.seqlen_k, Traits::kFp8),
      {},
  };
  if constexpr (Traits::kVtSmem) {
    // (keys, head_dim_v), head dim contiguous.
    params.tma_v_rows = make_tma_copy(
        typename Traits::TmaKVOp{},
        v_keys_contiguous ? v_as(p.head_dim_v, rows_k, p.v_col_stride) : v_as(rows_k, p.head_dim_v, p.v_row_stride),
        take<0, 2>(typename Traits::SmemLayoutVRows{}), Shape<typename Traits::BN, typename Traits::DV>{},
        typename Traits::Cluster{});
  }
  TileCounter counter;

  const std::int64_t tiles = static_cast<std::int64_t>(params.num_m_blocks) * p.nheads_q * p.batch;
  // A varlen call whose sequences have no query rows (max_seqlen_q 0) has no tile.
  if (tiles == 0) return Status::ok();
  // Tile indices, the scheduler's overshoot past the last one included, are ints.
  if (tiles > INT32_MAX - std::max(p.num_sms, 1)) {
    return {StatusCode::kInvalidArgument, "problem too large: about 2^31 query tiles or more"};
  }
  auto kernel = fwd_kernel<Kernel>;
  // The attribute is per function and per device; setting it every call costs little
  // next to a launch and stays correct when the caller switches devices.
  Status st = detail::cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes),
      "cudaFuncSetAttribute(max dynamic shared memory)");
  if (!st.is_ok()) return st;
  cudaLaunchAttribute cluster_attr{};
  cluster_attr.id = cudaLaunchAttributeClusterDimension;
  cluster_attr.val.clusterDim.x = kCluster;
  cluster_attr.val.clusterDim.y = 1;
  cluster_attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(Traits::kThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  config.attrs = &cluster_attr;
  config.numAttrs = kCluster > 1 ? 1 : 0;
  // One CTA per SM, as far as whole clusters can be resident at once (the tile count
  // is a multiple of the cluster size).
  std::int64_t resident = std::max(p.num_sms, kCluster);
  if constexpr (kCluster > 1) {
    config.gridDim = dim3(static_cast<unsigned>(resident / kCluster * kCluster));
    int clusters = 0;
    const Status sized = detail::max_active_clusters(kernel, config, &clusters);
    if (!sized.is_ok()) return sized;
    resident = std::min<std::int64_t>(resident / kCluster, clusters) * kCluster;
  }
  const int grid = static_cast<int>(std::min<std::int64_t>(tiles, resident));
  config.gridDim = dim3(static_cast<unsigned>(grid));
  // Varlen calls draw from a counter on the kernels that take the order of real tiles
  // (FwdKernel::kVarlenOrder, produce_varlen).
  if (Kernel::Scheduler::kDynamic || (Kernel::kVarlenOrder && is_varlen<kCfg.varlen>(p))) {
    const Status acquired = acquire_tile_counter(stream, &counter);
    if (!acquired.is_ok()) return acquired;
    params.tile_counter = counter.ptr;
  }
  TimelineCapture timeline;
  if constexpr (kFwdTimeline) {
    const Status began = timeline_begin(grid, Traits::kConsumerWGs, stream, &timeline);
    if (!began.is_ok()) {
      const Status released = release_tile_counter(counter, stream);
      return released.is_ok() ? began : released;
    }
    params.p.timeline = timeline.buffer;
    params.p.timeline_capacity = timeline.capacity;
  }
  const Status launched = detail::cuda_status(cudaLaunchKernelEx(&config, kernel, params), "forward kernel launch");
  const Status released = release_tile_counter(counter, stream);
  if constexpr (kFwdTimeline) {
    const Status recorded = timeline_end(timeline, __PRETTY_FUNCTION__, Traits::kBlockN, stream);
    if (launched.is_ok() && released.is_ok()) return recorded;
  }
  return launched.is_ok() ? released : launched;
}

}  // namespace fa3::hopper
