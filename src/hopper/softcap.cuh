// fa3 — the softcap: a score s becomes cap·tanh(s/cap) before the softmax, with s the
// scaled score (softmax_scale · q·k), as FlashAttention and the references define it.
//
// The kernels keep scores unscaled until the softmax's exp2, which folds the scale in.
// A capped score leaves Softcap::apply as t = tanh(s_raw·scale/cap) alone, and the
// softmax then scales it by the cap instead of the softmax scale (softmax_scale_of):
// cap·t is the capped score, and the multiply folds into the exp2's FMA.
//
// tanh is computed to about 2e-7 absolute error (tanh_scaled), not with tanh.approx,
// whose 2^-11 would be the largest error of a bf16 forward's scores. Its cost decides
// the softcap's: the softmax already spends one special-function (MUFU) operation per
// score, which with the GEMMs' 2 · d FLOPs per score keeps MUFU about as busy as the
// tensor cores; every further MUFU operation per score slows a tile down. So tanh
// takes one exp2 and computes its reciprocal with FMAs. Causal hdim 128 16k: 200
// TFLOP/s with ex2 + rcp, 231 with this, 353 once general tiles took the dynamic tile
// order, against 638 without the cap; the instructions per score, not MUFU, now bound
// it (docs/perf-log.md).
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

#include "hopper/arch/ptx.cuh"

namespace fa3::hopper {

// tanh(x·scale) for scale > 0, given k = -2·scale·log2 e: (1 - e)/(1 + e) with
// e = exp2(|x|·k) = exp(-2|x·scale|) in (0, 1], the sign restored from x. Folding the
// scale into ex2's argument and the sign into a bit operation leaves nine FMA-pipe
// instructions and one MUFU per score: 1/(1 + e) is a minimax quadratic in e (relative
// error 1/99) and two Newton steps (1e-8 before rounding), all FMAs, and (1 - e)·r is
// r - e·r. The error is ex2's (2^-22 of e): about 2e-7 absolute, 1e-6 relative where
// |tanh| >= 0.2. Large |x| gives e = 0 and exactly +-1; no inf or NaN arises from a
// finite x. The host form (tests) takes exp2f.
__host__ __device__ __forceinline__ float tanh_scaled(float x, float k) {
#ifdef __CUDA_ARCH__
  const float e = arch::exp2_approx(fabsf(x) * k);
#else
  const float e = exp2f(fabsf(x) * k);
#endif
  const float y = 1.f + e;
  float r = fmaf(fmaf(32.f / 99.f, e, -80.f / 99.f), e, 98.f / 99.f);
  r = fmaf(r, fmaf(-y, r, 1.f), r);
  r = fmaf(r, fmaf(-y, r, 1.f), r);
  return copysignf(fmaf(-e, r, r), x);
}

// The cap of a kernel that may have one (off when cap <= 0), on unscaled scores.
struct Softcap {
  float cap;
  float ex2_in;     // -2 log2 e · scale / cap: an unscaled score's tanh_scaled argument k
  float t_per_log;  // 1 / (cap · log2 e): tanh from a probability's log2 (slope below)
  bool on;

  __host__ __device__ Softcap(float cap_, float softmax_scale)
      : cap(cap_ > 0.f ? cap_ : 0.f),
        ex2_in(cap_ > 0.f ? -2.8853900817779268f * softmax_scale / cap_ : 0.f),
        t_per_log(cap_ > 0.f ? 1.f / (cap_ * 1.4426950408889634f) : 0.f),
        on(cap_ > 0.f) {}

  // Replaces every score of a fragment by its tanh(s·scale/cap); the softmax scales
  // these by the cap (softmax_scale_of).
  template <class Tensor>
  __device__ __forceinline__ void apply(Tensor& s) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(s); ++i) s(i) = tanh_scaled(s(i), ex2_in);
  }

  // The cap's slope 1 - tanh² at a score, recovered from its probability p and its
  // row's LSE·log2 e (`lse_log2`): log2 p = cap·tanh·log2 e - lse_log2. The backward
  // gets it this way rather than keeping a slope per score from S to dS, which cost
  // the hdim 128 kernel 300 bytes of spills. A probability of 0 (masked, or below
  // fp32's range) has a dS of 0 whatever the slope: 0 then, not NaN from log2 0.
  __device__ __forceinline__ float slope(float p, float lse_log2) const {
    const float t = (arch::log2_approx(p) + lse_log2) * t_per_log;
    return p > 0.f ? fmaf(-t, t, 1.f) : 0.f;
  }
};

}  // namespace fa3::hopper
