// fa3 — the backward pass's workspace: where each scratch array lives in the caller's
// buffer. Plain host code, shared by the size query, the launch and the tests.
//
// Regions, each 256-byte aligned:
//   dq_accum      fp32 (regions, nheads_q, q_blocks * block_m * d): dQ's partial sums, each
//                 query block's block_m x d values in the order the consumer threads
//                 hold them (bwd_post.cuh puts them back in place)
//   lse_log2      fp32 (regions, nheads_q, q_blocks * block_m): LSE·log2(e); +inf for
//                 rows past seqlen_q and rows that saw no key, so that their P is 0
//   dpsum         fp32, same shape: D = rowsum(dO∘O); 0 past seqlen_q
//   dk/dv_accum   fp32 (regions, nheads_kv, k_blocks * block_n * d), with GQA/MQA only
//                 (dkv_sums): the sums over a KV head's query heads, in the same thread
//                 order
//   semaphores    int, deterministic only: per (region, head, query block) the number of
//                 key blocks whose dQ part is in; with dkv_sums per (region, KV head, key
//                 block) the number of query heads whose dK/dV part is in
//   tile_counter  int: the dynamic tile scheduler's counter (hopper/tile_scheduler.cuh)
// The preprocess kernel zeroes dq_accum and everything from dk_accum on.
//
// A fixed-length call has a region per batch entry, of m_blocks query blocks (q_blocks)
// and n_blocks key blocks (k_blocks) per head. A varlen call (packed rows, fa3/attention.h)
// has one region: sequence b's query blocks start at block (cu_seqlens_q[b] + b * block_m)
// / block_m of its head, the packed offset plus b blocks rounded down to a block, and its
// key blocks at (cu_seqlens_k[b] + b * block_n) / block_n (first_block). Rounding down
// loses less than the block added per sequence, so a sequence's blocks end at or before
// the next one's start, and q_blocks = (total_q + batch * block_m) / block_m holds them
// all. m_blocks and n_blocks are then those of max_seqlen_q and max_seqlen_k, the blocks
// the kernels' grids cover per sequence.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fa3::hopper {

// seqlen_q and seqlen_k are a varlen call's max_seqlen_q and max_seqlen_k; total_q and
// total_k its packed rows (0: a fixed-length call).
struct BwdShape {
  std::int64_t batch, seqlen_q, seqlen_k, nheads_q, nheads_kv, head_dim;
  bool varlen = false;
  std::int64_t total_q = 0, total_k = 0;
};

// The first of a varlen sequence's blocks in its head's part of the workspace (above):
// `offset` its first packed row, `batch` its index.
constexpr std::int64_t first_block(std::int64_t offset, std::int64_t batch, int block) {
  return (offset + batch * block) / block;
}

struct BwdWorkspace {
  static constexpr std::size_t kAlign = 256;
  int block_m = 0, block_n = 0;             // the kernel's query and key blocks
  std::int64_t m_blocks = 0, n_blocks = 0;  // per sequence
  std::int64_t regions = 0;                 // batch, or 1 for a varlen call
  std::int64_t q_blocks = 0, k_blocks = 0;  // per (region, head)
  std::int64_t q_rows = 0;  // q_blocks * block_m: rows per (region, head) of lse_log2 and dpsum
  std::size_t dq_accum = 0, lse_log2 = 0, dpsum = 0;
  std::size_t dk_accum = 0, dv_accum = 0;  // == zero_begin when not GQA
  std::size_t dq_semaphore = 0, dkv_semaphore = 0, tile_counter = 0;
  std::size_t zero_begin = 0;  // [zero_begin, bytes) is zeroed with dq_accum
  std::size_t bytes = 0;
  bool gqa = false;
  bool dkv_sums = false;  // dK and dV summed in dk/dv_accum: GQA/MQA (bwd_kernel.cuh)
  bool deterministic = false;
};

constexpr BwdWorkspace bwd_workspace_layout(const BwdShape& s, int block_m, int block_n, bool deterministic) {
  auto align = [](std::size_t x) { return (x + BwdWorkspace::kAlign - 1) / BwdWorkspace::kAlign * BwdWorkspace::kAlign; };
  BwdWorkspace w;
  w.block_m = block_m;
  w.block_n = block_n;
  w.m_blocks = (s.seqlen_q + block_m - 1) / block_m;
  w.n_blocks = (s.seqlen_k + block_n - 1) / block_n;
  w.gqa = s.nheads_q != s.nheads_kv;
  w.dkv_sums = w.gqa;
  w.deterministic = deterministic;
  w.regions = s.varlen ? 1 : s.batch;
  w.q_blocks = s.varlen ? (s.total_q + s.batch * block_m) / block_m : w.m_blocks;
  w.k_blocks = s.varlen ? (s.total_k + s.batch * block_n) / block_n : w.n_blocks;
  const std::size_t q_heads = static_cast<std::size_t>(w.regions * s.nheads_q);
  const std::size_t kv_heads = static_cast<std::size_t>(w.regions * s.nheads_kv);
  w.q_rows = w.q_blocks * block_m;
  const std::size_t q_rows = static_cast<std::size_t>(w.q_rows);
  const std::size_t k_rows = static_cast<std::size_t>(w.k_blocks * block_n);
  const std::size_t d = static_cast<std::size_t>(s.head_dim);
  std::size_t at = 0;
  w.dq_accum = at;
  at = align(at + q_heads * q_rows * d * 4);
  w.lse_log2 = at;
  at = align(at + q_heads * q_rows * 4);
  w.dpsum = at;
  at = align(at + q_heads * q_rows * 4);
  w.zero_begin = at;
  w.dk_accum = at;
  if (w.dkv_sums) at = align(at + kv_heads * k_rows * d * 4);
  w.dv_accum = at;
  if (w.dkv_sums) at = align(at + kv_heads * k_rows * d * 4);
  w.dq_semaphore = at;
  if (deterministic) at = align(at + q_heads * static_cast<std::size_t>(w.q_blocks) * 4);
  w.dkv_semaphore = at;
  if (deterministic && w.dkv_sums) at = align(at + kv_heads * static_cast<std::size_t>(w.k_blocks) * 4);
  w.tile_counter = at;
  at = align(at + 4);
  w.bytes = at;
  return w;
}

}  // namespace fa3::hopper
