#include "reference/fp8_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/hadamard.h"
#include "common/numeric.h"

namespace fa3::reference {

void hadamard_rotate(float* x, int head_dim, std::uint64_t seed) {
  const int n = hadamard::block_size(head_dim);
  for (int c = 0; c < head_dim; ++c) {
    if (hadamard::negative(seed, c)) x[c] = -x[c];
  }
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < head_dim; ++i) {
      if (i & h) continue;  // i is the lower partner of the pair (i, i + h)
      const float a = x[i], b = x[i + h];
      x[i] = a + b;
      x[i + h] = a - b;
    }
  }
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int c = 0; c < head_dim; ++c) x[c] *= norm;
}

namespace {

// One (batch, head)'s rows of a tensor: where row 0 lies, and the step between rows.
struct Rows {
  std::int64_t base, stride;
};

// Entry (or sequence) b, head h of a (batch, seqlen, nheads, d) tensor, or of a varlen
// call's (total, nheads, d) one whose sequence b starts at row `first`.
Rows rows_of(const TensorView& t, bool packed, std::int64_t b, std::int64_t first, std::int64_t h) {
  if (packed) return {first * t.stride[0] + h * t.stride[1], t.stride[0]};
  return {b * t.stride[0] + h * t.stride[2], t.stride[1]};
}

}  // namespace

void fp8_quantize(const fp8::QuantizeArgs& a) {
  const TensorView& in = a.input;
  const bool packed = a.cu_seqlens.defined();
  const auto* cu = static_cast<const std::int32_t*>(a.cu_seqlens.data);
  const std::int64_t batch = packed ? a.cu_seqlens.shape[0] - 1 : in.shape[0];
  const std::int64_t heads = in.shape[packed ? 1 : 2];
  const int d = static_cast<int>(in.shape[in.rank - 1]);
  const std::int64_t blocks = ((packed ? a.max_seqlen : in.shape[1]) + a.block_rows - 1) / a.block_rows;
  std::vector<float> rows;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t first = packed ? cu[b] : 0;
    const std::int64_t seqlen = packed ? cu[b + 1] - first : in.shape[1];
    for (std::int64_t h = 0; h < heads; ++h) {
      const Rows src = rows_of(in, packed, b, first, h);
      const Rows dst = rows_of(a.output, packed, b, first, h);
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        // A varlen sequence's blocks past its rows hold none: scale 1.
        const std::int64_t r0 = blk * a.block_rows, r1 = std::max(r0, std::min(seqlen, r0 + a.block_rows));
        rows.assign(static_cast<std::size_t>((r1 - r0) * d), 0.f);
        float absmax = 0.f;
        for (std::int64_t r = r0; r < r1; ++r) {
          float* y = &rows[static_cast<std::size_t>((r - r0) * d)];
          const std::int64_t base = src.base + r * src.stride;
          for (int c = 0; c < d; ++c) y[c] = numeric::load_as_float(in.data, base + c, in.dtype);
          if (a.hadamard) hadamard_rotate(y, d, a.seed);
          for (int c = 0; c < d; ++c) absmax = std::fmax(absmax, std::fabs(y[c]));
        }
        const float scale = absmax > 0.f ? absmax / fp8::kE4m3Max : 1.f;
        const float inv = absmax > 0.f ? fp8::kE4m3Max / absmax : 1.f;
        static_cast<float*>(a.scale.data)[b * a.scale.stride[0] + h * a.scale.stride[1] + blk * a.scale.stride[2]] =
            scale;
        for (std::int64_t r = r0; r < r1; ++r) {
          const float* y = &rows[static_cast<std::size_t>((r - r0) * d)];
          auto* codes = static_cast<std::uint8_t*>(a.output.data) + dst.base + r * dst.stride;
          for (int c = 0; c < d; ++c) codes[c] = numeric::float_to_e4m3(y[c] * inv);
        }
      }
    }
  }
}

}  // namespace fa3::reference
