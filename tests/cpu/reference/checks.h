// Comparisons of the tiled CPU path against the exact reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "host_tensor.h"
#include "reference/naive.h"
#include "reference/tiled_cpu.h"

namespace fa3::testing {

// How far an fp32-accumulating implementation may stray from the exact result.
// fp32 rounds each operation by at most eps = 2^-24 (relative). A score is a sum of
// head_dim products; an absolute error e in a score changes that key's weight by a
// relative e, so the output error scales with the scores' magnitude (about
// eps * |score| per score) times max|V|, plus the rounding of the weighted sum of up
// to seqlen_k rows of V, which grows like sqrt(seqlen_k) * eps for random signs
// (~2e-6 for 1000 keys). With the default scale, normal inputs give scores of a few
// units and errors of ~3e-7 * max|V| (~1e-6 with scores near 10); 1e-5 * max|V|
// keeps an order of magnitude of margin, while a real bug (a dropped key, a wrong
// rescale, a stray bf16 rounding) errs by 1e-3 or more. lse = max + log(sum) has
// the same sources and is of order 1 + |lse|.
constexpr double kFp32OutTolerance = 1e-5;
constexpr double kFp32LseTolerance = 1e-5;

// Half a unit in the last place, relative, of the storage dtype: the extra error of
// rounding the fp32 result when it is stored.
inline double storage_rounding(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return std::ldexp(1.0, -8);
    case DType::kFloat16: return std::ldexp(1.0, -11);
    default: return 0;
  }
}

// Every element of `got` is within atol + rtol * |want| of `want` (NaN never is).
inline void expect_close(const char* what, const HostTensor& got, const std::vector<double>& want, double atol,
                         double rtol) {
  std::int64_t bad = 0;
  std::string first;
  double worst = 0;
  got.for_each([&](const Index& i, std::int64_t n) {
    const double w = want[static_cast<std::size_t>(n)];
    const double err = abs_error(got.get(i), w);
    worst = std::max(worst, err);
    if (err <= atol + rtol * std::fabs(w)) return;
    if (bad++ == 0) {
      first = "(" + std::to_string(i[0]) + ", " + std::to_string(i[1]) + ", " + std::to_string(i[2]) + ", " +
              std::to_string(i[3]) + "): got " + std::to_string(got.get(i)) + ", want " + std::to_string(w);
    }
  });
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements out of tolerance (atol " << atol << ", rtol " << rtol
                    << "), worst error " << worst << ", first at " << first;
}

// Runs the tiled path on a fresh random case and compares out and lse with the exact
// reference; also checks that every output element was written and no padding was.
// `score_growth` widens the fp32 tolerance for cases whose scores are far larger than
// those of the default scale (see kFp32OutTolerance).
inline void expect_tiled_matches_exact(const Case& c, std::uint64_t seed,
                                       const reference::TiledCpuConfig& config = {}, double score_growth = 1) {
  SCOPED_TRACE(c.name() + " blocks " + std::to_string(config.block_m) + "x" + std::to_string(config.block_n));
  Attention a = make_attention(c, seed);
  reference::tiled_forward(a.problem, a.args(), config);
  const reference::ForwardResult ref =
      reference::forward(a.problem, a.q.view(), a.k.view(), a.v.view(), reference::Precision::kExact, a.sinks_view());

  const double vmax = max_abs(a.v.values());
  expect_close("out", a.out, ref.out, score_growth * kFp32OutTolerance * vmax, storage_rounding(c.dtype));
  expect_close("lse", a.lse, ref.lse, score_growth * kFp32LseTolerance, score_growth * kFp32LseTolerance);
  EXPECT_TRUE(a.out.padding_is_nan()) << "out: written outside its view";
  EXPECT_TRUE(a.lse.padding_is_nan()) << "lse: written outside its view";
}

}  // namespace fa3::testing
