// fa3 program — checking the gradients a backward pass wrote against the exact
// reference on sampled rows: query rows for dq, key rows for dk and dv.
#pragma once

#include <cstdint>
#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"
#include "reference/naive.h"

namespace fa3::cli {

struct GradientCheck {
  std::int64_t rows = 0;     // rows compared with the reference
  double max_error = 0;      // max |got - ref| over those rows
  double max_reference = 0;  // max |ref| over them
  double bound = 0;          // gradient_bound(dtype, max_reference)
  std::int64_t nans = 0;     // NaNs anywhere in the gradient (including rows not sampled)
  bool passed = false;       // no NaN, error within bound
};

struct GradientChecks {
  GradientCheck dq, dk, dv;
  bool passed() const { return dq.passed && dk.passed && dv.passed; }
};

// Largest |got - ref| accepted for a gradient. Gradients have no natural size (dv sums
// probabilities times dout over every query that sees a key, dq shrinks as rows see
// more keys), so the bound is error_bound(dtype) relative to the largest reference
// value checked, plus 1e-5 for values that are 0 in exact arithmetic but come out of
// fp32 sums as a few ulps.
double gradient_bound(DType dtype, double max_reference);

// `args` are host views of the inputs and of the gradients the backward wrote.
// `threads` runs the reference (0: one per hardware thread).
GradientChecks check_gradients(const Problem& p, const BackwardArgs& args,
                               const std::vector<reference::RowRef>& query_rows,
                               const std::vector<reference::RowRef>& key_rows, int threads);

}  // namespace fa3::cli
