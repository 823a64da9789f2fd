// fa3 — the backward pass's workspace: where each scratch array lives in the caller's
// buffer. Plain host code, shared by the size query, the launch and the tests.
//
// Regions, each 256-byte aligned:
//   dq_accum      fp32 (batch, nheads_q, m_blocks * block_m * d): dQ's partial sums, each
//                 query block's block_m x d values in the order the consumer threads
//                 hold them (bwd_post.cuh puts them back in place)
//   lse_log2      fp32 (batch, nheads_q, m_blocks * block_m): LSE·log2(e); +inf for
//                 rows past seqlen_q and rows that saw no key, so that their P is 0
//   dpsum         fp32, same shape: D = rowsum(dO∘O); 0 past seqlen_q
//   dk/dv_accum   fp32 (batch, nheads_kv, n_blocks * block_n * d), GQA/MQA only: the
//                 sums over a KV head's query heads, in the same thread order
//   semaphores    int, deterministic only: per (batch, head, query block) the number of
//                 key blocks whose dQ part is in; with GQA/MQA per (batch, KV head, key
//                 block) the number of query heads whose dK/dV part is in
//   tile_counter  int: the dynamic tile scheduler's counter (hopper/tile_scheduler.cuh)
// The preprocess kernel zeroes dq_accum and everything from dk_accum on.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fa3::hopper {

struct BwdShape {
  std::int64_t batch, seqlen_q, seqlen_k, nheads_q, nheads_kv, head_dim;
};

struct BwdWorkspace {
  static constexpr std::size_t kAlign = 256;
  std::int64_t m_blocks = 0, n_blocks = 0;
  std::int64_t q_rows = 0;  // m_blocks * block_m: rows per head of lse_log2 and dpsum
  std::size_t dq_accum = 0, lse_log2 = 0, dpsum = 0;
  std::size_t dk_accum = 0, dv_accum = 0;  // == zero_begin when not GQA
  std::size_t dq_semaphore = 0, dkv_semaphore = 0, tile_counter = 0;
  std::size_t zero_begin = 0;  // [zero_begin, bytes) is zeroed with dq_accum
  std::size_t bytes = 0;
  bool gqa = false;
  bool deterministic = false;
};

constexpr BwdWorkspace bwd_workspace_layout(const BwdShape& s, int block_m, int block_n, bool deterministic) {
  auto align = [](std::size_t x) { return (x + BwdWorkspace::kAlign - 1) / BwdWorkspace::kAlign * BwdWorkspace::kAlign; };
  BwdWorkspace w;
  w.m_blocks = (s.seqlen_q + block_m - 1) / block_m;
  w.n_blocks = (s.seqlen_k + block_n - 1) / block_n;
  w.gqa = s.nheads_q != s.nheads_kv;
  w.deterministic = deterministic;
  const std::size_t q_heads = static_cast<std::size_t>(s.batch * s.nheads_q);
  const std::size_t kv_heads = static_cast<std::size_t>(s.batch * s.nheads_kv);
  w.q_rows = w.m_blocks * block_m;
  const std::size_t q_rows = static_cast<std::size_t>(w.q_rows);
  const std::size_t k_rows = static_cast<std::size_t>(w.n_blocks * block_n);
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
  if (w.gqa) at = align(at + kv_heads * k_rows * d * 4);
  w.dv_accum = at;
  if (w.gqa) at = align(at + kv_heads * k_rows * d * 4);
  w.dq_semaphore = at;
  if (deterministic) at = align(at + q_heads * static_cast<std::size_t>(w.m_blocks) * 4);
  w.dkv_semaphore = at;
  if (deterministic && w.gqa) at = align(at + kv_heads * static_cast<std::size_t>(w.n_blocks) * 4);
  w.tile_counter = at;
  at = align(at + 4);
  w.bytes = at;
  return w;
}

}  // namespace fa3::hopper
