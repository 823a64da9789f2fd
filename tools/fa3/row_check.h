// fa3 program — checking a result against the exact reference on a sample of rows, so
// that problems of any size can be checked in moments.
#pragma once

#include <cstdint>
#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"
#include "reference/naive.h"

namespace fa3::cli {

// Largest absolute error of out accepted for each input dtype: output rounding plus
// fp32 accumulation, with margin (the FlashAttention rule's absolute caps).
double error_bound(DType dtype);

// `count` query rows spread over (batch, head, row): one from each of `count` equal
// slices of that order, the last slice giving the very last row, where masks and
// sequence ends meet. All rows when `count` covers them.
std::vector<reference::RowRef> sample_rows(const Problem& p, std::int64_t count, std::uint64_t seed);
// The same over (batch, KV head, key): RowRefs whose head is a KV head and whose row
// is a key, the rows of dk and dv.
std::vector<reference::RowRef> sample_key_rows(const Problem& p, std::int64_t count, std::uint64_t seed);

// Element (i0, i1, i2, i3) of a host view, as fp32.
float element(const TensorView& t, std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3 = 0);
// NaNs in a contiguous host view.
std::int64_t count_nans(const TensorView& t);
// |got - want|, where two infinities of the same sign agree (a fully masked row's lse).
double difference(double got, double want);

struct RowCheck {
  std::int64_t rows = 0;         // rows compared with the reference
  double max_out_error = 0;      // max |out - ref| over those rows
  double max_lse_error = 0;      // max |lse - ref|; both -inf counts as equal
  std::int64_t nan_out = 0;      // NaNs anywhere in out (including rows not sampled)
  std::int64_t nan_lse = 0;      // NaNs anywhere in lse
  double bound = 0;              // error_bound(dtype)
  bool passed = false;           // no NaN, out within bound, lse within bound * max(1, |ref|)
};

// `args` are host views of the inputs and of the outputs the forward wrote.
RowCheck check_rows(const Problem& p, const ForwardArgs& args, const std::vector<reference::RowRef>& rows);

}  // namespace fa3::cli
