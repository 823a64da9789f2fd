// fa3 — a validated attention problem: sizes and resolved options.
//
// Everything below the public API (CPU paths, references, kernels' host code) works
// from a Problem, never from raw user options, so that defaults (the softmax scale)
// and mask rules (causal as a window) are resolved in exactly one place.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fa3 {

struct Problem {
  std::int64_t batch = 0;
  std::int64_t seqlen_q = 0;
  std::int64_t seqlen_k = 0;
  std::int64_t nheads_q = 0;
  std::int64_t nheads_kv = 0;
  std::int64_t head_dim = 0;       // of q and k
  std::int64_t head_dim_v = 0;     // of v, out and their gradients; may differ from head_dim
  float softmax_scale = 0.f;       // resolved: never 0
  bool causal = false;
  std::int64_t window_left = -1;   // resolved: -1 unbounded
  std::int64_t window_right = -1;  // resolved: causal gives 0
  float softcap = 0.f;             // 0: off
  std::int64_t chunk = 0;          // attention_chunk; 0: none
  int sm_margin = 0;               // SMs the GPU kernels leave free (AttentionOptions)
  bool has_sinks = false;          // attention sinks given (fa3/attention.h)
  bool fp8_block_scales = false;  // e4m3 inputs with block scales (fa3/attention.h's Fp8Args)
  // A variable-length batch (fa3/attention.h): batch sequences packed along total_q query
  // rows and total_k keys; seqlen_q and seqlen_k are then the caller's max_seqlen_q and
  // max_seqlen_k, bounds rather than every sequence's lengths, and the masks below hold
  // per sequence, for the Problem each sequence is on its own (reference/varlen.h).
  bool varlen = false;
  std::int64_t total_q = 0;
  std::int64_t total_k = 0;

  std::int64_t group_size() const { return nheads_q / nheads_kv; }
  // The SMs the GPU kernels of this call may use on a device of `sm_count`: all but the
  // margin, one at least.
  int usable_sms(int sm_count) const { return sm_count - sm_margin > 1 ? sm_count - sm_margin : 1; }
  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  bool restricts_keys() const { return has_window() || chunk > 0; }

  // The keys query row i may see are [first_key(i), last_key(i)] (empty when first > last).
  // The diagonal is aligned to the bottom-right corner: query i sits at key i + sk - sq.
  // Both bounds never decrease with i, chunks included (the tiled paths rely on it).
  std::int64_t first_key(std::int64_t i) const {
    std::int64_t first = window_left < 0 ? 0 : std::max<std::int64_t>(0, i + seqlen_k - seqlen_q - window_left);
    if (chunk > 0) first = std::max(first, chunk_start(i));
    return first;
  }
  std::int64_t last_key(std::int64_t i) const {
    std::int64_t last =
        window_right < 0 ? seqlen_k - 1 : std::min<std::int64_t>(seqlen_k - 1, i + seqlen_k - seqlen_q + window_right);
    if (chunk > 0) last = std::min(last, chunk_start(i) + chunk - 1);
    return last;
  }
  // The first key of query i's chunk (rounded down, also for queries before key 0).
  std::int64_t chunk_start(std::int64_t i) const {
    const std::int64_t pos = i + seqlen_k - seqlen_q;
    const std::int64_t c = pos >= 0 ? pos / chunk : -((-pos + chunk - 1) / chunk);
    return c * chunk;
  }
  bool visible(std::int64_t i, std::int64_t j) const { return j >= first_key(i) && j <= last_key(i); }

  // FLOPs of the forward pass counted as the field does (FlashAttention papers,
  // ANCHORS): 2 * batch * nheads * sq * sk * (d + dv), S = Q K^T costing the d and
  // O = P V the dv (4 * ... * d when they are equal), halved when causal with sq == sk.
  // Other masks (windows, causal with sq != sk) count the visible pairs exactly.
  double forward_flops() const;
};

}  // namespace fa3
