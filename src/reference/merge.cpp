#include "reference/merge.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/numeric.h"
#include "reference/lse_merge.h"

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
  const auto parts = static_cast<std::int64_t>(args.outs.size());
  // The whole row is merged before it is written, so that out may be a part's storage.
  std::vector<float> row(static_cast<std::size_t>(head_dim));
  for (std::int64_t b = 0; b < shape.shape[0]; ++b) {
    for (std::int64_t s = 0; s < shape.shape[1]; ++s) {
      for (std::int64_t h = 0; h < shape.shape[2]; ++h) {
        const float lse = merge_row(
            parts, head_dim, [&](std::int64_t i) { return lse_at(args.lses[static_cast<std::size_t>(i)], b, h, s); },
            [&](std::int64_t i, std::int64_t d) {
              const TensorView& part = args.outs[static_cast<std::size_t>(i)];
              return numeric::load_as_float(part.data, row_offset(part, b, s, h) + d * part.stride[3], part.dtype);
            },
            row.data());
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
