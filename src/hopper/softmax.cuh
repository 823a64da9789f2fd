// fa3 — online softmax over a thread's rows of the score fragment, fp32 throughout.
//
// Scores arrive unscaled. Exponentials use exp2 with the softmax scale folded into a
// single FMA: p = 2^(s * scale*log2(e) - m * scale*log2(e)). Row sums stay per-thread
// partial sums until the end (the four threads of a quad share a row), which saves
// two shuffles per row per key block.
//
// The reference m need not be the exact running max: any m works as long as P, the
// row sums and O all use the same one, and the final 1/sum and LSE then come out
// exact. So the references move only when some row of the warp has grown its max by
// more than a factor of 2^kMaxGrowthLog2 since its m was set (p stays <= 256: no
// overflow in fp32 sums or bf16 P). After the first few key blocks a row's max rarely
// grows that much, and the warp skips the rescale of O (d/2 multiplies per row per
// block) and of the row sums. The decision is per warp, not per row, so that skipping
// is a branch the whole warp takes. kLazy = false moves the references every block
// (the plain online softmax).
//
// kLog2Shift > 0 (the FP8 forward) scales every weight by 2^kLog2Shift, in the exponent:
// P then lies in [0, 2^kLog2Shift] rather than [0, 1], so that rounding it to e4m3 keeps
// weights down to 2^-17 at a shift of 8 (fa3/attention.h). The row sums carry the same
// factor, which cancels in O / sum; finish() takes it out of the LSE. With kLazy a
// weight may grow past 2^kLog2Shift by the growth the reference tolerates, so that growth
// is then what keeps P below e4m3's largest value, 448 = 2^8.807: 0.8 (P < 2^8.8).
//
// FP8 tiles also have a scale per key block (k's block scale, hopper/fp8_scales.cuh). The
// scaled update() takes it as `block_scale` (> 0, finite) and applies it to the block's
// max (once per row) and to the exponent's FMA (once per block) instead of to every
// score: max(s * k) = max(s) * k for k > 0, rounding included.
#pragma once

#include <cute/tensor.hpp>

#include "hopper/arch/ptx.cuh"

namespace fa3::hopper {

// Max / sum over the four lanes of a quad (lanes that hold the same rows).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// log2(448), e4m3's largest finite value, rounded down.
inline constexpr float kE4m3MaxLog2 = 8.8f;

template <int kRows, bool kLazy = true, int kLog2Shift = 0>
struct OnlineSoftmax {
  static constexpr int kRowsPerThread = kRows;
  // The growth of a row's max (log2 units, scaled scores) that leaves its reference in
  // place: weights then stay below 2^(kLog2Shift + kMaxGrowthLog2).
  static constexpr float kMaxGrowthLog2 = kLog2Shift == 0 ? 8.f : kE4m3MaxLog2 - kLog2Shift;
  static_assert(kMaxGrowthLog2 > 0.f, "the shift leaves no room below e4m3's largest value");
  float row_max[kRows];  // reference max of raw (kScaled: block-scaled) scores; -inf while a row has seen nothing
  float row_sum[kRows];  // this thread's partial sum of exp2(...) relative to row_max
  float scale_log2;

  __device__ explicit OnlineSoftmax(float softmax_scale_log2) : scale_log2(softmax_scale_log2) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Folds the (rows, cols) score view `s` into the running statistics, overwriting
  // it with unnormalized probabilities. Returns whether earlier output accumulators
  // must be rescaled, by the factors written to `rescale`; the answer is the same for
  // the whole warp, so a caller's branch on it does not diverge. The first block
  // (kFirst) sets the references and returns false.
  template <bool kFirst, class TensorS>
  __device__ __forceinline__ bool update(TensorS& s, float (&rescale)[kRows]) {
    return update<kFirst, false>(s, rescale, 1.f, false);
  }

  // The same for scores that count `block_scale` times their value (kScaled, see
  // above). `move_all` (warp-uniform) moves every reference on this block, lazy or not,
  // for a caller that rescales O at such blocks anyway.
  template <bool kFirst, bool kScaled, class TensorS>
  __device__ __forceinline__ bool update(TensorS& s, float (&rescale)[kRows], float block_scale, bool move_all) {
    static_assert(decltype(cute::size<0>(s))::value == kRows);
    static_assert(decltype(cute::size<1>(s))::value >= 4, "four chains need four columns");
    float block_max[kRows];
    bool grown = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      // Four independent chains: the max and the sum of a row are dependency chains
      // across its columns, and a single chain would leave the ALUs waiting. The
      // chains start from the row's first columns, not from -inf: the compiler may not
      // drop fmaxf(-inf, x) (NaN rules), and it would cost three instructions per row.
      // Scaled scores meet the reference only after the block's max is scaled.
      float part[4] = {kScaled ? s(r, 0) : fmaxf(row_max[r], s(r, 0)), s(r, 1), s(r, 2), s(r, 3)};
      CUTE_UNROLL
      for (int c = 4; c < cute::size<1>(s); ++c) part[c % 4] = fmaxf(part[c % 4], s(r, c));
      block_max[r] = quad_max(fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3])));
      if constexpr (kScaled) block_max[r] = fmaxf(row_max[r], block_max[r] * block_scale);
      // -inf - -inf is NaN and compares false: a row still without keys stays as is.
      grown |= (block_max[r] - row_max[r]) * scale_log2 > kMaxGrowthLog2;
    }
    if constexpr (!kFirst) grown = kLazy ? move_all || __any_sync(0xffffffffu, grown) : true;
    if (kFirst || grown) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        if constexpr (!kFirst) {
          rescale[r] = arch::exp2_approx((row_max[r] - block_max[r]) * scale_log2);
          // A row that had no keys before: exp2(NaN or -inf); its sum and O are 0 and stay 0.
          if (row_max[r] == -INFINITY) rescale[r] = 0.f;
          row_sum[r] *= rescale[r];
        }
        row_max[r] = block_max[r];
      }
    }
    const float score_log2 = kScaled ? scale_log2 * block_scale : scale_log2;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      // A row that has seen only masked keys keeps max -inf; exponentiate against 0
      // instead so that exp2(-inf) = 0 and no NaN appears.
      const float m_scaled = (row_max[r] == -INFINITY ? 0.f : row_max[r] * scale_log2) - kLog2Shift;
      float sum[4];
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(s); ++c) {
        s(r, c) = arch::exp2_approx(fmaf(s(r, c), score_log2, -m_scaled));
        // The chains start from their first terms (0 + x costs an add: x may be -0).
        sum[c % 4] = c < 4 ? s(r, c) : sum[c % 4] + s(r, c);
      }
      row_sum[r] += (sum[0] + sum[1]) + (sum[2] + sum[3]);
    }
    return !kFirst && grown;
  }

  // The rows' final statistics once the last key block has been folded in: 1/sum, which
  // normalizes O (0 for a row that saw no key), and the natural-log LSE (-inf for such a
  // row). They do not depend on O, so they can be computed while the last P·V runs.
  __device__ __forceinline__ void finish(float softmax_scale, float (&inv)[kRows], float (&lse)[kRows]) const {
    constexpr float kLn2 = 0.69314718055994530942f;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      // A row that saw a key has a sum of about 1 or more (its reference max contributed
      // exp2(0)), far from where the approximations lose accuracy; 0 or NaN: no key.
      const float sum = quad_sum(row_sum[r]);
      const bool empty = !(sum > 0.f);
      inv[r] = empty ? 0.f : arch::rcp_approx(sum);
      lse[r] = empty ? -INFINITY : row_max[r] * softmax_scale + (arch::log2_approx(sum) - kLog2Shift) * kLn2;
    }
  }
};

// Folds head `head`'s attention sink (a logit with no value, fa3/attention.h) into rows'
// final statistics: LSE becomes log(e^LSE + e^sink), and 1/sum shrinks by e^(LSE - new
// LSE), so that O's probabilities are relative to the new denominator. A row that saw
// no key (LSE -inf, 1/sum 0) gets LSE = sink and O stays 0. Once per row per tile, with
// accurate expf/logf: the LSE is an output.
template <class Params, int kRows>
__device__ __forceinline__ void add_sink(const Params& p, int head, float (&inv)[kRows], float (&lse)[kRows]) {
  if (p.sinks == nullptr) return;
  const float sink = p.sinks[head * p.sinks_stride];
  if (sink == -INFINITY) return;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const float m = fmaxf(lse[r], sink);
    const float total = m + logf(expf(lse[r] - m) + expf(sink - m));
    inv[r] *= expf(lse[r] - total);
    lse[r] = total;
  }
}

// Multiplies each row of the (rows, cols) view `o` by its factor.
template <int kRows, class TensorO>
__device__ __forceinline__ void rescale_rows(TensorO& o, const float (&factor)[kRows]) {
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(o); ++c) o(r, c) *= factor[r];
  }
}

}  // namespace fa3::hopper
