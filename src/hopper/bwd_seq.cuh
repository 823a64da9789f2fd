// fa3 — a backward tile's sequence: where its query and key blocks lie in the workspace
// (hopper/bwd_workspace.h). With kCarries false (a kernel without the varlen paths) the
// varlen branches fold away and a block's place is its fixed-length one.
#pragma once

#include <cstdint>

#include "hopper/bwd_params.h"
#include "hopper/bwd_workspace.h"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

// Query block m_block of (batch, head), in units of kBlockM rows of lse_log2 and dpsum
// (and of kBlockM x d values of dq_accum, and of dq_semaphore's counters); `seq` is the
// sequence's (seq_bounds).
template <int kBlockM, bool kCarries>
__host__ __device__ __forceinline__ std::int64_t q_block_index(const BwdParams& p, int batch, int head,
                                                               const SeqBounds& seq, int m_block) {
  const std::int64_t region = tensor_batch<kCarries>(p, batch);
  const std::int64_t first = is_varlen<kCarries>(p) ? first_block(seq.offset_q, batch, kBlockM) : 0;
  return (region * p.nheads_q + head) * p.layout.q_blocks + first + m_block;
}

// Key block n_block of (batch, KV head head_kv), in units of kBlockN x d values of
// dk/dv_accum and of dkv_semaphore's counters.
template <int kBlockN, bool kCarries>
__host__ __device__ __forceinline__ std::int64_t k_block_index(const BwdParams& p, int batch, int head_kv,
                                                               const SeqBounds& seq, int n_block) {
  const std::int64_t region = tensor_batch<kCarries>(p, batch);
  const std::int64_t first = is_varlen<kCarries>(p) ? first_block(seq.offset_k, batch, kBlockN) : 0;
  return (region * p.nheads_kv + head_kv) * p.layout.k_blocks + first + n_block;
}

// How many of a block's rows, from `first_row` on, are the sequence's (`rows` of them):
// kBlock for a whole block, fewer (0 or less: none) at the sequence's end.
template <int kBlock>
__host__ __device__ __forceinline__ int rows_in_block(int rows, int first_row) {
  const int n = rows - first_row;
  return n < kBlock ? n : kBlock;
}

}  // namespace fa3::hopper
