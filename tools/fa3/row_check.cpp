#include "row_check.h"

#include <algorithm>
#include <cmath>

#include "common/numeric.h"

namespace fa3::cli {
namespace {

// `count` of the `batch x heads x rows` (batch, head, row) triples, as sample_rows says.
std::vector<reference::RowRef> spread(std::int64_t batch, std::int64_t heads, std::int64_t rows_per_head,
                                      std::int64_t count, std::uint64_t seed) {
  const std::int64_t total = batch * heads * rows_per_head;
  std::vector<reference::RowRef> rows;
  if (count <= 0) return rows;
  auto decode = [&](std::int64_t flat) {
    return reference::RowRef{flat / (heads * rows_per_head), (flat / rows_per_head) % heads, flat % rows_per_head};
  };
  if (count >= total) {
    for (std::int64_t f = 0; f < total; ++f) rows.push_back(decode(f));
    return rows;
  }
  // A 64-bit LCG step per row is plenty to scatter picks inside their slices.
  std::uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (std::int64_t s = 0; s < count; ++s) {
    const std::int64_t lo = s * total / count;
    const std::int64_t hi = (s + 1) * total / count;
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const std::int64_t flat = s == count - 1 ? total - 1 : lo + static_cast<std::int64_t>((state >> 33) % (hi - lo));
    rows.push_back(decode(flat));
  }
  return rows;
}

}  // namespace

float element(const TensorView& t, std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) {
  const std::int64_t index[TensorView::kMaxRank] = {i0, i1, i2, i3};
  const std::int64_t offset = t.byte_offset(index) / static_cast<std::int64_t>(dtype_size(t.dtype));
  return numeric::load_as_float(t.data, offset, t.dtype);
}

std::int64_t count_nans(const TensorView& t) {
  // The views are contiguous: a flat scan covers every element once.
  std::int64_t n = 0;
  const std::int64_t total = t.numel();
  for (std::int64_t i = 0; i < total; ++i) n += std::isnan(numeric::load_as_float(t.data, i, t.dtype)) ? 1 : 0;
  return n;
}

double difference(double got, double want) {
  if (std::isinf(got) && std::isinf(want) && (got > 0) == (want > 0)) return 0;
  return std::fabs(got - want);
}

double error_bound(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return 2e-2;
    case DType::kFloat16: return 4e-3;
    // e4m3 inputs: the reference takes their values exactly, but the FP8 path rounds
    // each weight P to e4m3 (within 2^-4 relative) before P V, and an output element is
    // a few such weights' sum where keys are few (fa3/attention.h).
    case DType::kFloat8E4M3: return 1e-1;
    default: return 1e-5;
  }
}

// lse's bound relative to max(1, |lse|): the out bound, except for e4m3 inputs, whose
// lse comes from the unrounded weights: the scores' own error only, which the FP8
// MMA's accumulation (about 14 bits) makes up to a few 1e-3.
double lse_bound(DType dtype) { return dtype == DType::kFloat8E4M3 ? 1e-2 : error_bound(dtype); }

std::vector<reference::RowRef> sample_rows(const Problem& p, std::int64_t count, std::uint64_t seed) {
  return spread(p.batch, p.nheads_q, p.seqlen_q, count, seed);
}

std::vector<reference::RowRef> sample_key_rows(const Problem& p, std::int64_t count, std::uint64_t seed) {
  // Another seed: the picks inside each slice need not line up with the query rows'.
  return spread(p.batch, p.nheads_kv, p.seqlen_k, count, ~seed);
}

RowCheck check_rows(const Problem& p, const ForwardArgs& args, const std::vector<reference::RowRef>& rows) {
  RowCheck c;
  c.bound = error_bound(args.q.dtype);
  c.rows = static_cast<std::int64_t>(rows.size());
  c.nan_out = count_nans(args.out);
  c.nan_lse = args.lse.defined() ? count_nans(args.lse) : 0;
  bool lse_ok = true;
  if (!rows.empty()) {
    const reference::ForwardResult ref = reference::forward_rows(p, args.q, args.k, args.v, rows, args.sinks);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const reference::RowRef& row = rows[r];
      for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
        const double got = element(args.out, row.batch, row.row, row.head, d);
        const double err = difference(got, ref.out[r * p.head_dim_v + d]);
        c.max_out_error = std::max(c.max_out_error, std::isnan(err) ? INFINITY : err);
      }
      if (args.lse.defined()) {
        const double want = ref.lse[r];
        const double err = difference(element(args.lse, row.batch, row.head, row.row), want);
        const double scaled_bound =
            lse_bound(args.q.dtype) * std::max(1.0, std::isfinite(want) ? std::fabs(want) : 1.0);
        if (!(err <= scaled_bound)) lse_ok = false;
        c.max_lse_error = std::max(c.max_lse_error, std::isnan(err) ? INFINITY : err);
      }
    }
  }
  c.passed = c.nan_out == 0 && c.nan_lse == 0 && c.max_out_error <= c.bound && lse_ok;
  return c;
}

}  // namespace fa3::cli
