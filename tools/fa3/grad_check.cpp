#include "grad_check.h"

#include <algorithm>
#include <cmath>

#include "grad_reference.h"
#include "row_check.h"

namespace fa3::cli {
namespace {

// One gradient's sampled rows against their reference values (ref[r * head_dim + c], the
// head dim being the gradient's own).
GradientCheck compare(const TensorView& got, const std::vector<reference::RowRef>& rows, const std::vector<double>& ref,
                      std::int64_t head_dim) {
  GradientCheck c;
  c.rows = static_cast<std::int64_t>(rows.size());
  c.nans = count_nans(got);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (std::int64_t d = 0; d < head_dim; ++d) {
      const double want = ref[r * static_cast<std::size_t>(head_dim) + static_cast<std::size_t>(d)];
      const double err = difference(element(got, rows[r].batch, rows[r].row, rows[r].head, d), want);
      c.max_error = std::max(c.max_error, std::isnan(err) ? INFINITY : err);
      c.max_reference = std::max(c.max_reference, std::fabs(want));
    }
  }
  c.bound = gradient_bound(got.dtype, c.max_reference);
  c.passed = c.nans == 0 && c.max_error <= c.bound;
  return c;
}

}  // namespace

double gradient_bound(DType dtype, double max_reference) { return error_bound(dtype) * max_reference + 1e-5; }

GradientChecks check_gradients(const Problem& p, const BackwardArgs& args,
                               const std::vector<reference::RowRef>& query_rows,
                               const std::vector<reference::RowRef>& key_rows, int threads) {
  const GradientRows ref = reference_gradients(p, args, query_rows, key_rows, threads);
  GradientChecks c;
  c.dq = compare(args.dq, query_rows, ref.dq, p.head_dim);
  c.dk = compare(args.dk, key_rows, ref.dk, p.head_dim);
  c.dv = compare(args.dv, key_rows, ref.dv, p.head_dim_v);
  return c;
}

}  // namespace fa3::cli
