// fa3 — which family of kernels runs a problem: plain (every key), causal (bottom-right
// diagonal), or general (any window, the softcap, attention sinks). Plain and causal calls keep
// kernels of their own, tuned and free of the general family's per-block bounds; a
// problem goes to the general ones only when it needs them.
#pragma once

#include <string>

#include "api/problem.h"

namespace fa3::hopper {

enum class MaskKind { kPlain, kCausal, kGeneral };

inline MaskKind mask_kind(const Problem& p) {
  if (p.softcap > 0.f || p.window_left >= 0 || p.has_sinks || p.chunk > 0) return MaskKind::kGeneral;
  // A window of (-1, 0) is causal whether or not the caller said so.
  if (p.window_right == 0) return MaskKind::kCausal;
  return p.window_right < 0 ? MaskKind::kPlain : MaskKind::kGeneral;
}

// The kernel files' names for the families ("plain", "causal", "general").
inline const char* mask_kind_name(MaskKind k) {
  return k == MaskKind::kPlain ? "plain" : k == MaskKind::kCausal ? "causal" : "general";
}
inline MaskKind mask_kind_from_name(const std::string& name) {
  return name == "causal" ? MaskKind::kCausal : name == "general" ? MaskKind::kGeneral : MaskKind::kPlain;
}

}  // namespace fa3::hopper
