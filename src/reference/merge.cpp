#include "reference/merge.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/numeric.h"

namespace fa3::reference {
namespace {

float lse_at(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t s) {
  return static_cast<const float*>(t.data)[b * t.stride[0] + h * t.stride[1] + s * t.stride[2]];
}

std::int64_t row_offset(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h) {
  return b * t.stride[0] + s * t.stride[1] + h * t.stride[2];
}

}  // namespace

void merge_states(const MergeArgs& args) {
  const TensorView& shape = args.out;
  const std::int64_t head_dim = shape.shape[3];
  const std::size_t parts = args.outs.size();
  std::vector<float> weight(parts);
  // The whole row is read before it is written, so that out may be a part's storage.
  std::vector<float> row(static_cast<std::size_t>(head_dim));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (std::int64_t b = 0; b < shape.shape[0]; ++b) {
    for (std::int64_t s = 0; s < shape.shape[1]; ++s) {
      for (std::int64_t h = 0; h < shape.shape[2]; ++h) {
        float max_lse = neg_inf;
        for (std::size_t i = 0; i < parts; ++i) max_lse = std::max(max_lse, lse_at(args.lses[i], b, h, s));
        float lse = neg_inf;
        std::fill(row.begin(), row.end(), 0.f);
        // A row that saw no key in any part stays 0 with lse -inf; exp(-inf - -inf)
        // would make it NaN.
        if (max_lse != neg_inf) {
          float sum = 0.f;
          for (std::size_t i = 0; i < parts; ++i) sum += std::exp(lse_at(args.lses[i], b, h, s) - max_lse);
          lse = max_lse + std::log(sum);
          for (std::size_t i = 0; i < parts; ++i) weight[i] = std::exp(lse_at(args.lses[i], b, h, s) - lse);
          for (std::size_t i = 0; i < parts; ++i) {
            // A part that saw no key of this row holds 0 there (weight 0); skipping it
            // keeps a non-finite value it might hold from reaching the result.
            if (weight[i] == 0.f) continue;
            const TensorView& part = args.outs[i];
            const std::int64_t base = row_offset(part, b, s, h);
            for (std::int64_t d = 0; d < head_dim; ++d) {
              row[static_cast<std::size_t>(d)] +=
                  weight[i] * numeric::load_as_float(part.data, base + d * part.stride[3], part.dtype);
            }
          }
        }
        const std::int64_t base = row_offset(args.out, b, s, h);
        for (std::int64_t d = 0; d < head_dim; ++d) {
          numeric::store_from_float(args.out.data, base + d * args.out.stride[3], args.out.dtype,
                                    row[static_cast<std::size_t>(d)]);
        }
        static_cast<float*>(args.lse.data)[b * args.lse.stride[0] + h * args.lse.stride[1] + s * args.lse.stride[2]] =
            lse;
      }
    }
  }
}

}  // namespace fa3::reference
