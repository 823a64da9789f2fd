// fa3 — host side of the backward pass: TMA descriptors, grids, the three launches
// (preprocess, main kernel, postprocess). Included only by the generated
// per-(dtype, head dim, mask) translation units.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "fa3/status.h"
#include "hopper/bwd_config.h"
#include "hopper/bwd_dq_order.h"
#include "hopper/bwd_kernel.cuh"
#include "hopper/bwd_params.h"
#include "hopper/bwd_post.cuh"
#include "hopper/bwd_pre.cuh"
#include "hopper/bwd_seq.cuh"
#include "hopper/bwd_sinks.h"
#include "hopper/bwd_traits.cuh"
#include "hopper/launch_util.h"
#include "hopper/mask.cuh"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

// dQ from its accumulator: one CTA per (query block, head, batch). In a varlen call a
// block past its sequence's rows has nothing to write, and a sequence's rows start at its
// first packed row.
template <class Traits>
__global__ void __launch_bounds__(Traits::kConsumerThreads) bwd_convert_dq(const __grid_constant__ BwdParams p) {
  constexpr bool kVarlen = Traits::kVarlen;
  // Launched as a programmatic dependent of the main kernel (kBwdPdl): its sums first.
  if constexpr (kBwdPdl) arch::wait_grid_dependencies();
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const SeqBounds seq = seq_bounds<kVarlen>(p, batch);
  if (is_varlen<kVarlen>(p) && m_block * Traits::kBlockM >= seq.seqlen_q) return;
  const std::int64_t block = q_block_index<Traits::kBlockM, kVarlen>(p, batch, head, seq, m_block);
  const char* ws = static_cast<const char*>(p.workspace);
  AccumTarget t;
  t.accum = reinterpret_cast<const float*>(ws + p.layout.dq_accum) +
            block * static_cast<std::int64_t>(Traits::kBlockM * Traits::kHeadDim);
  t.out = static_cast<typename Traits::Element*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
          (seq.offset_q + static_cast<std::int64_t>(m_block) * Traits::kBlockM) * p.dq_row_stride;
  t.row_stride = p.dq_row_stride;
  t.rows = std::min(static_cast<int>(Traits::kBlockM), seq.seqlen_q - m_block * Traits::kBlockM);
  t.cols = p.head_dim;
  t.scale = p.softmax_scale;
  convert_accum_block<typename Traits::Element, typename Traits::TiledMmaDq, Traits::kBlockM, Traits::kHeadDim,
                      Traits::kDqSwap>(t);
}

// GQA/MQA (dkv_sums): dK (blockIdx.z even) or dV (odd) from its accumulator,
// one CTA per (key block, KV head, batch and which); a varlen sequence's as dQ's above.
template <class Traits>
__global__ void __launch_bounds__(Traits::kConsumerThreads) bwd_convert_dkv(const __grid_constant__ BwdParams p) {
  constexpr bool kVarlen = Traits::kVarlen;
  const int n_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z / 2;
  const bool is_dv = blockIdx.z % 2 != 0;
  const SeqBounds seq = seq_bounds<kVarlen>(p, batch);
  if (is_varlen<kVarlen>(p) && n_block * Traits::kBlockN >= seq.seqlen_k) return;
  const std::int64_t block = k_block_index<Traits::kBlockN, kVarlen>(p, batch, head, seq, n_block);
  const char* ws = static_cast<const char*>(p.workspace);
  AccumTarget t;
  t.accum = reinterpret_cast<const float*>(ws + (is_dv ? p.layout.dv_accum : p.layout.dk_accum)) +
            block * static_cast<std::int64_t>(Traits::kBlockN * Traits::kHeadDim);
  const std::int64_t row_stride = is_dv ? p.dv_row_stride : p.dk_row_stride;
  t.out = static_cast<typename Traits::Element*>(is_dv ? p.dv : p.dk) +
          batch * (is_dv ? p.dv_batch_stride : p.dk_batch_stride) + head * (is_dv ? p.dv_head_stride : p.dk_head_stride) +
          (seq.offset_k + static_cast<std::int64_t>(n_block) * Traits::kBlockN) * row_stride;
  t.row_stride = row_stride;
  t.rows = std::min(static_cast<int>(Traits::kBlockN), seq.seqlen_k - n_block * Traits::kBlockN);
  t.cols = is_dv ? p.head_dim_v : p.head_dim;
  t.scale = 1.f;  // dK was scaled before it was summed
  convert_accum_block<typename Traits::Element, typename Traits::TiledMmaDkv, Traits::kBlockN, Traits::kHeadDim,
                      Traits::kDkvSwap>(t);
}

template <class Kernel>
Status launch_bwd_main(const typename Kernel::Params& params, int grid, cudaStream_t stream) {
  auto kernel = bwd_kernel<Kernel>;
  constexpr int kSmemBytes = Kernel::Traits::kSmemBytes;
  const Status attr = detail::cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
      "cudaFuncSetAttribute(max dynamic shared memory)");
  if (!attr.is_ok()) return attr;
  return detail::cuda_status(
      detail::launch_kernel(kernel, dim3(grid), dim3(Kernel::kThreads), kSmemBytes, stream, kBwdPdl, params),
      "backward kernel launch");
}

// kVarlen: the instance that carries the varlen paths (BwdConfig::varlen): the general
// family's, and at the head dims of FA3_BWD_VARLEN_OWN_HEAD_DIMS the plain and causal
// ones' too.
template <class Element, int kHeadDim, class Mask, bool kVarlen>
Status launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using namespace cute;
  static_assert(!kVarlen || kVarlenKernels);
  constexpr BwdConfig kCfg = [] {
    BwdConfig c = bwd_config(kHeadDim);
    c.varlen = kVarlen;
    return c;
  }();
  using Traits = BwdTraits<Element, kHeadDim, kCfg>;
  using Kernel = BwdKernel<Traits, Mask>;
  using Stride = typename Traits::GmemStride;
  using BM = typename Traits::BM;
  using BN = typename Traits::BN;
  using D = typename Traits::D;

  auto gmem = [](const void* ptr) { return make_gmem_ptr(static_cast<const Element*>(ptr)); };
  // As in the forward, the tensors have the call's head dims (kHeadDim or less): Q, K
  // and their gradients head_dim, V, dO and dV head_dim_v. A varlen call's packed tensors
  // are one batch entry of all their rows, which the kernel offsets to each sequence's
  // first row.
  const int rows_q = q_rows<kCfg.varlen>(p);
  const int rows_k = k_rows<kCfg.varlen>(p);
  const int batches = tensor_batches<kCfg.varlen>(p);
  auto strides = [&](std::int64_t row, std::int64_t head, std::int64_t batch, int rows, int heads, int dim) {
    const std::int64_t row_stride = detail::usable_stride(row, rows, detail::padded_row<Element>(dim));
    const std::int64_t head_stride = detail::usable_stride(head, heads, row_stride * rows);
    return Stride{row_stride, _1{}, head_stride, detail::usable_stride(batch, batches, head_stride * heads)};
  };
  const auto q_tensor = [&](const void* ptr, std::int64_t row, std::int64_t head, std::int64_t batch, int dim) {
    return make_tensor(gmem(ptr), make_shape(rows_q, dim, p.nheads_q, batches),
                       strides(row, head, batch, rows_q, p.nheads_q, dim));
  };
  const auto kv_tensor = [&](const void* ptr, std::int64_t row, std::int64_t head, std::int64_t batch, int dim) {
    return make_tensor(gmem(ptr), make_shape(rows_k, dim, p.nheads_kv, batches),
                       strides(row, head, batch, rows_k, p.nheads_kv, dim));
  };
  typename Kernel::Params params{
      make_tma_copy(SM90_TMA_LOAD{}, q_tensor(p.q, p.q_row_stride, p.q_head_stride, p.q_batch_stride, p.head_dim),
                    take<0, 2>(typename Traits::SmemLayoutQ{}), Shape<BM, D>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, q_tensor(p.dout, p.do_row_stride, p.do_head_stride, p.do_batch_stride, p.head_dim_v),
                    take<0, 2>(typename Traits::SmemLayoutDo{}), Shape<BM, D>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, kv_tensor(p.k, p.k_row_stride, p.k_head_stride, p.k_batch_stride, p.head_dim),
                    typename Traits::SmemLayoutK{}, Shape<BN, D>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, kv_tensor(p.v, p.v_row_stride, p.v_head_stride, p.v_batch_stride, p.head_dim_v),
                    typename Traits::SmemLayoutV{}, Shape<BN, D>{}, _1{}),
      // Without dkv_sums (GQA/MQA sum dK and dV in the workspace), fixed length: dK, dV
      // shaped like K, V.
      make_tma_copy(SM90_TMA_STORE{}, kv_tensor(p.dk, p.dk_row_stride, p.dk_head_stride, p.dk_batch_stride, p.head_dim),
                    typename Traits::SmemLayoutK{}, Shape<BN, D>{}, _1{}),
      make_tma_copy(SM90_TMA_STORE{}, kv_tensor(p.dv, p.dv_row_stride, p.dv_head_stride, p.dv_batch_stride, p.head_dim_v),
                    typename Traits::SmemLayoutV{}, Shape<BN, D>{}, _1{}),
      p,
      1,
      false,
  };
  const int n_blocks = static_cast<int>(p.layout.n_blocks);
  const int m_blocks = static_cast<int>(p.layout.m_blocks);
  if constexpr (Kernel::Scheduler::kDynamic) {
    // Every tile of a head reads all of its Q and dO, and adds into all of its dQ sums.
    const double q_do_bytes = 2.0 * p.seqlen_q * kHeadDim * sizeof(Element);
    const double head_bytes = q_do_bytes + 4.0 * p.seqlen_q * kHeadDim;
    const std::int64_t pairs = static_cast<std::int64_t>(p.nheads_q) * p.batch;
    if (p.deterministic) {
      params.heads_per_group = fitting_heads_per_group(head_bytes, kDeterministicL2Budget, pairs, p.num_sms, n_blocks);
    } else if constexpr (!Mask::kCausal && !Mask::kGeneral) {
      // Without a mask (a varlen call: the only one in this order) a sequence's tiles
      // all walk its query blocks, so the dynamic draw alone evens out the CTAs' work
      // and the groups are sized for the L2 alone (docs/perf-log.md: groups of the
      // causal order's size made equal lengths 6 % slower).
      params.heads_per_group = fitting_heads_per_group(head_bytes, kStreamingL2Budget, pairs, p.num_sms, n_blocks);
    } else {
      params.heads_per_group = causal_heads_per_group(q_do_bytes, 1, pairs, p.num_sms, Traits::kBlockN, n_blocks);
    }
  }
  const std::int64_t tiles = static_cast<std::int64_t>(n_blocks) * p.nheads_q * p.batch;
  if (tiles > INT32_MAX - std::max(p.num_sms, 1)) {
    return {StatusCode::kInvalidArgument, "problem too large: about 2^31 key tiles or more"};
  }
  if (p.nheads_q > 65535 || p.batch > 65535 / 2) {
    return {StatusCode::kNotSupported, "backward: more than 65535 heads or 32767 sequences in one call"};
  }

  // At least one CTA, which zeroes the workspace's sums and counters, also when a varlen
  // call's sequences have no query rows (max_seqlen_q 0).
  bwd_preprocess<Element, Traits::kBlockM, kHeadDim, kCfg.varlen>
      <<<dim3(std::max(m_blocks, 1), p.nheads_q, p.batch), kBwdPreThreads, 0, stream>>>(p);
  const Status pre = detail::cuda_status(cudaGetLastError(), "backward preprocess launch");
  if (!pre.is_ok()) return pre;
  const Status sinks = launch_sinks_grad(p, stream);
  if (!sinks.is_ok()) return sinks;

  // A varlen call whose sequences have no keys (max_seqlen_k 0) has no tile: its dQ are
  // the zeros the preprocess left in the accumulator.
  if (tiles > 0) {
    const int grid = static_cast<int>(std::min<std::int64_t>(tiles, std::max(p.num_sms, 1)));
    // Deterministic non-causal calls of fixed length start each tile at a query block of
    // its own (hopper/bwd_dq_order.h), where the order's 32-bit arithmetic holds.
    params.spread_starts =
        kBwdSpreadStarts && p.deterministic && !Kernel::Scheduler::kDynamic && !kCfg.varlen &&
        static_dq_order_fits(static_cast<std::int64_t>(p.nheads_q) * p.batch, n_blocks, grid, m_blocks);
    const Status main = launch_bwd_main<Kernel>(params, grid, stream);
    if (!main.is_ok()) return main;
  }
  if (m_blocks > 0) {
    const Status post =
        detail::cuda_status(detail::launch_kernel(bwd_convert_dq<Traits>, dim3(m_blocks, p.nheads_q, p.batch),
                                                  dim3(Traits::kConsumerThreads), 0, stream, kBwdPdl, p),
                            "backward dQ conversion launch");
    if (!post.is_ok()) return post;
  }
  if (!p.layout.dkv_sums || n_blocks == 0) return Status::ok();
  bwd_convert_dkv<Traits><<<dim3(n_blocks, p.nheads_kv, 2 * p.batch), Traits::kConsumerThreads, 0, stream>>>(p);
  return detail::cuda_status(cudaGetLastError(), "backward dK/dV conversion launch");
}

}  // namespace fa3::hopper
