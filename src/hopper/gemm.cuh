// fa3 — issuing warpgroup GEMMs (wgmma) from CuTe fragments, for both directions.
#pragma once

#include <cute/tensor.hpp>

namespace fa3::hopper {

// Issues one warpgroup GEMM batch (all K steps) and commits it; waiting is the caller's.
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_async(TiledMma& mma, const TA& a, const TB& b, TC& c) {
  using namespace cute;
  // A is either shared-memory descriptors (S = Q·Kᵀ) or registers (P in P·V).
  constexpr bool kARegisters = !is_same_v<remove_cvref_t<typename TA::value_type>, GmmaDescriptor>;
  if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? SM90::GMMA::ScaleOut::Zero : SM90::GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = SM90::GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TA&>(a));
}

// gemm_async with the roles of the two operands swapped when kSwap: `a` is the
// operand whose rows are the product's rows in the unswapped form, so a caller writes
// one call for C = A·B and Cᵀ = B·A alike.
template <bool kSwap, bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_ab(TiledMma& mma, const TA& a, const TB& b, TC& c) {
  if constexpr (kSwap) {
    gemm_async<kZeroInit>(mma, b, a, c);
  } else {
    gemm_async<kZeroInit>(mma, a, b, c);
  }
}

// Row block `slice` of a fragment whose MMA_M mode holds several (MMA, 1, MMA_K or MMA_N).
template <class T>
__device__ __forceinline__ auto row_block(T&& t, int slice) {
  using namespace cute;
  return make_tensor(t(_, slice, _).data(), make_layout(layout<0>(t), Layout<_1>{}, layout<2>(t)));
}

// gemm_async restricted to row block `slice` of A's MMA_M mode (A holds kSlices of
// them, one per slice) into `c`, an accumulator of one row block: a GEMM issued in
// slices keeps only a slice's accumulators live at a time.
template <int kSlices, bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_async_slice(TiledMma& mma, const TA& a, const TB& b, TC& c, int slice) {
  using namespace cute;
  if constexpr (kSlices == 1) {
    gemm_async<kZeroInit>(mma, a, b, c);
  } else {
    static_assert(decltype(size<1>(a))::value == kSlices, "one MMA row block per slice");
    gemm_async<kZeroInit>(mma, row_block(a, slice), b, c);
  }
}

// The fragment of `t` as the A operand (kAsA) or the B operand of `thr`'s MMA.
template <bool kAsA, class ThrMma, class T>
__device__ __forceinline__ auto mma_operand(const ThrMma& thr, const T& t) {
  if constexpr (kAsA) {
    return thr.partition_fragment_A(t);
  } else {
    return thr.partition_fragment_B(t);
  }
}

}  // namespace fa3::hopper
