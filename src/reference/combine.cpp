#include "reference/combine.h"

#include <cstdint>
#include <vector>

#include "common/numeric.h"
#include "reference/lse_merge.h"

namespace fa3::reference {

void combine(const CombineProblem& p, const CombineArgs& a) {
  const auto* out_partial = static_cast<const float*>(a.out_partial.data);
  const auto* lse_partial = static_cast<const float*>(a.lse_partial.data);
  const TensorView& op = a.out_partial;
  const TensorView& lp = a.lse_partial;
  std::vector<float> acc(static_cast<std::size_t>(p.head_dim));
  for (std::int64_t r = 0; r < p.rows; ++r) {
    for (std::int64_t h = 0; h < p.nheads; ++h) {
      const float lse = merge_row(
          p.num_splits, p.head_dim,
          [&](std::int64_t s) { return lse_partial[s * lp.stride[0] + r * lp.stride[1] + h * lp.stride[2]]; },
          [&](std::int64_t s, std::int64_t d) {
            return out_partial[s * op.stride[0] + r * op.stride[1] + h * op.stride[2] + d];
          },
          acc.data());
      const std::int64_t base = r * a.out.stride[0] + h * a.out.stride[1];
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        numeric::store_from_float(a.out.data, base + d, a.out.dtype, acc[static_cast<std::size_t>(d)]);
      }
      if (a.lse.defined()) static_cast<float*>(a.lse.data)[r * a.lse.stride[0] + h * a.lse.stride[1]] = lse;
    }
  }
}

}  // namespace fa3::reference
