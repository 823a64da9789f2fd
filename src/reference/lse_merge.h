// fa3 — the exact merge of one row's partial attention results, shared by the merge of
// attention states (fa3/merge.h) and the split-KV combine (fa3/kvcache.h):
//   lse = log(sum_i exp(lse_i)),   out = sum_i exp(lse_i - lse) * out_i,   in fp32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace fa3::reference {

// Merges `parts` partial rows of `head_dim` values into acc and returns the row's lse.
// lse_of(i) is part i's lse, value_of(i, d) its d-th value. A row no part saw a key of
// (every lse -inf) gets acc 0 and lse -inf, not the NaN of exp(-inf - -inf); a part that
// saw no key of the row (weight 0) is not read, so whatever it holds stays out.
template <class LseOf, class ValueOf>
float merge_row(std::int64_t parts, std::int64_t head_dim, LseOf&& lse_of, ValueOf&& value_of, float* acc) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::fill(acc, acc + head_dim, 0.f);
  // The largest partial lse keeps every exp() in range.
  float max = kNegInf;
  for (std::int64_t i = 0; i < parts; ++i) max = std::fmax(max, lse_of(i));
  if (max == kNegInf) return kNegInf;
  float sum = 0.f;
  for (std::int64_t i = 0; i < parts; ++i) sum += std::exp(lse_of(i) - max);
  const float lse = max + std::log(sum);
  for (std::int64_t i = 0; i < parts; ++i) {
    const float w = std::exp(lse_of(i) - lse);
    if (w == 0.f) continue;
    for (std::int64_t d = 0; d < head_dim; ++d) acc[d] += w * value_of(i, d);
  }
  return lse;
}

}  // namespace fa3::reference
