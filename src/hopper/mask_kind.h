// fa3 — which family of kernels runs a problem: plain (every key), causal (bottom-right
// diagonal), or general (any window, chunked attention, the softcap). Plain and causal
// calls keep kernels of their own, tuned and free of the general family's per-block
// bounds; a problem goes to the general ones only when it needs them. Attention sinks
// need no family of their own: every forward kernel folds a sink into its rows' final
// statistics when one is given, and the backward's main kernels never read them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "api/problem.h"

namespace fa3::hopper {

enum class MaskKind { kPlain, kCausal, kGeneral };

inline MaskKind mask_kind(const Problem& p) {
  if (p.softcap > 0.f || p.window_left >= 0 || p.chunk > 0) return MaskKind::kGeneral;
  // A window of (-1, 0) is causal whether or not the caller said so.
  if (p.window_right == 0) return MaskKind::kCausal;
  return p.window_right < 0 ? MaskKind::kPlain : MaskKind::kGeneral;
}

// The mask's runtime fields of FwdParams or BwdParams for a problem (the general kernels
// read them). Windows wider than the sequences see the same keys as these, which fit in
// an int, and so does an unbounded side: a left side of seqlen_k and a right side of
// seqlen_q bound no row of the sequences. A chunk longer than the keys sees them all in
// its first chunk, as one of seqlen_k keys does. A chunk of one key is the diagonal, the
// window (0, 0), whatever window comes with it (every window holds the diagonal); a
// longer one comes with the numbers that divide by it: for the least s with
// 2^(s+1) >= chunk, the multiplier ceil(2^(32+s) / chunk) is below 2^32 and exact for
// dividends below 2^31.
template <class Params>
void set_mask_params(const Problem& p, Params* params) {
  params->window_left = static_cast<int>(p.window_left < 0 ? p.seqlen_k : std::min(p.window_left, p.seqlen_k));
  params->window_right = static_cast<int>(p.window_right < 0 ? p.seqlen_q : std::min(p.window_right, p.seqlen_q));
  const std::int64_t chunk = std::min(p.chunk, p.seqlen_k);
  params->chunk = 0;
  params->chunk_mul = 0;
  params->chunk_shift = 0;
  if (chunk == 1) {
    params->window_left = 0;
    params->window_right = 0;
  } else if (chunk > 1) {
    int shift = 0;
    while ((std::int64_t{2} << shift) < chunk) ++shift;
    params->chunk = static_cast<int>(chunk);
    params->chunk_mul = static_cast<std::uint32_t>(((std::uint64_t{1} << (32 + shift)) + chunk - 1) / chunk);
    params->chunk_shift = shift;
  }
}

// The kernel files' names for the families ("plain", "causal", "general").
inline const char* mask_kind_name(MaskKind k) {
  return k == MaskKind::kPlain ? "plain" : k == MaskKind::kCausal ? "causal" : "general";
}
inline MaskKind mask_kind_from_name(const std::string& name) {
  return name == "causal" ? MaskKind::kCausal : name == "general" ? MaskKind::kGeneral : MaskKind::kPlain;
}

}  // namespace fa3::hopper
