#include "reference/combine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/numeric.h"

namespace fa3::reference {

void combine(const CombineProblem& p, const CombineArgs& a) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const auto* out_partial = static_cast<const float*>(a.out_partial.data);
  const auto* lse_partial = static_cast<const float*>(a.lse_partial.data);
  const TensorView& op = a.out_partial;
  const TensorView& lp = a.lse_partial;
  std::vector<float> acc(static_cast<std::size_t>(p.head_dim));
  for (std::int64_t r = 0; r < p.rows; ++r) {
    for (std::int64_t h = 0; h < p.nheads; ++h) {
      auto lse_of = [&](std::int64_t s) { return lse_partial[s * lp.stride[0] + r * lp.stride[1] + h * lp.stride[2]]; };
      // The largest partial lse keeps every exp() in range; all -inf means no split saw a key.
      float max = kNegInf;
      for (std::int64_t s = 0; s < p.num_splits; ++s) max = std::fmax(max, lse_of(s));
      float lse = kNegInf;
      std::fill(acc.begin(), acc.end(), 0.f);
      if (max != kNegInf) {
        float sum = 0.f;
        for (std::int64_t s = 0; s < p.num_splits; ++s) sum += std::exp(lse_of(s) - max);
        lse = max + std::log(sum);
        for (std::int64_t s = 0; s < p.num_splits; ++s) {
          const float w = std::exp(lse_of(s) - lse);
          if (w == 0.f) continue;  // a split that saw no key may hold anything
          const float* part = out_partial + s * op.stride[0] + r * op.stride[1] + h * op.stride[2];
          for (std::int64_t d = 0; d < p.head_dim; ++d) acc[static_cast<std::size_t>(d)] += w * part[d];
        }
      }
      const std::int64_t base = r * a.out.stride[0] + h * a.out.stride[1];
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        numeric::store_from_float(a.out.data, base + d, a.out.dtype, acc[static_cast<std::size_t>(d)]);
      }
      if (a.lse.defined()) static_cast<float*>(a.lse.data)[r * a.lse.stride[0] + h * a.lse.stride[1]] = lse;
    }
  }
}

}  // namespace fa3::reference
