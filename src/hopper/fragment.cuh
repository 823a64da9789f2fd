// fa3 — views of wgmma accumulator fragments.
//
// A thread's share of an m64nN accumulator is laid out ((2, 2, N/8), MMA_M, MMA_N):
// two adjacent columns, two rows 8 apart, N/8 column groups 8 apart. Softmax wants it
// as (rows, cols); the P·V GEMM wants the same registers as its A operand
// ((2, 2, 2), MMA_M, N/16), which for 16-bit types is a pure re-view: value order
// (column pair, row half, column group) matches the A fragment's (k pair, row half,
// k half) order.
#pragma once

#include <cutlass/numeric_conversion.h>

#include <cute/tensor.hpp>

#include "hopper/arch/ptx.cuh"
#include "hopper/fp8_layout.h"

namespace fa3::hopper {

// ((2, 2, V), M, N) -> ((2, M), (2, V, N)): rows first, columns second.
template <class AccLayout>
__device__ __forceinline__ constexpr auto rowcol_layout(AccLayout acc) {
  using namespace cute;
  static_assert(rank(AccLayout{}) == 3 && rank<0>(AccLayout{}) == 3);
  auto v = layout<0>(acc);
  return make_layout(make_layout(layout<1>(v), layout<1>(acc)),
                     make_layout(layout<0>(v), layout<2>(v), layout<2>(acc)));
}

// ((2, 2, V), M, 1) -> ((2, 2, 2), M, V/2): the accumulator read as an A operand.
template <class AccLayout>
__device__ __forceinline__ constexpr auto acc_as_a_layout(AccLayout acc) {
  using namespace cute;
  static_assert(rank(AccLayout{}) == 3 && rank<0>(AccLayout{}) == 3);
  static_assert(size<2>(AccLayout{}) == 1, "one MMA along N per thread");
  auto v = layout<0>(acc);
  auto groups = logical_divide(layout<2>(v), Layout<_2>{});  // (2, V/2)
  return make_layout(make_layout(layout<0>(v), layout<1>(v), layout<0>(groups)), layout<1>(acc),
                     coalesce(make_layout(layout<1>(groups), layout<2>(acc))));
}

template <class Engine, class Layout>
__device__ __forceinline__ auto rowcol_view(cute::Tensor<Engine, Layout>& t) {
  return cute::make_tensor(t.data(), rowcol_layout(t.layout()));
}

template <class Engine, class Layout>
__device__ __forceinline__ auto rowcol_view(const cute::Tensor<Engine, Layout>& t) {
  return cute::make_tensor(t.data(), rowcol_layout(t.layout()));
}

// Converts `src` (fp32) into the existing fragment `dst` of the same size.
template <class DstEngine, class DstLayout, class SrcEngine, class SrcLayout>
__device__ __forceinline__ void convert_into(cute::Tensor<DstEngine, DstLayout>& dst,
                                             const cute::Tensor<SrcEngine, SrcLayout>& src) {
  using To = typename DstEngine::value_type;
  using From = typename SrcEngine::value_type;
  constexpr int kN = decltype(cute::size(src))::value;
  static_assert(decltype(cute::size(dst))::value == kN);
  cutlass::NumericArrayConverter<To, From, kN> convert;
  *reinterpret_cast<cutlass::Array<To, kN>*>(dst.data()) =
      convert(*reinterpret_cast<const cutlass::Array<From, kN>*>(src.data()));
}

// Fragment of fp32 values -> an owning fragment of `To` with the same (compact)
// layout, converted in packed pairs (cvt.rn.bf16x2 / f16x2).
template <class To, class Engine, class Layout>
__device__ __forceinline__ auto convert_fragment(const cute::Tensor<Engine, Layout>& src) {
  constexpr int kN = decltype(cute::size(src))::value;
  static_assert(kN % 2 == 0);
  // Exactly src's layout: callers re-view the registers through it.
  auto dst = cute::make_tensor<To>(src.layout());
  convert_into(dst, src);
  return dst;
}

// P (the fp32 accumulator `s` of one m64nN block, ((2, 2, N/8), 1, 1)) as the A operand
// of the P·V GEMM, in `To`: an owning fragment in the operand's layout. 16-bit types
// re-view the accumulator's order; e4m3 takes the operand's own ((4, 2, 2), 1, N/32),
// filled by convert_p.
template <class To, class AccLayout>
__device__ __forceinline__ auto make_p_operand(AccLayout acc) {
  using namespace cute;
  if constexpr (sizeof_bits_v<To> == 8) {
    constexpr int kSlices = decltype(size<0, 2>(AccLayout{}))::value / 4;  // 32-key slices
    return make_tensor<To>(Layout<Shape<Shape<_4, _2, _2>, _1, Int<kSlices>>>{});
  } else {
    return make_tensor<To>(acc_as_a_layout(acc));
  }
}

// Converts the accumulator `src` into `dst`, a fragment from make_p_operand. For e4m3,
// each A value takes the accumulator value hopper/fp8_layout.h's fp8_p_source names,
// which reorders keys inside each thread only (Vᵀ's columns are in the same order).
template <class DstEngine, class DstLayout, class SrcEngine, class SrcLayout>
__device__ __forceinline__ void convert_p(cute::Tensor<DstEngine, DstLayout>& dst,
                                          const cute::Tensor<SrcEngine, SrcLayout>& src) {
  using To = typename DstEngine::value_type;
  if constexpr (cute::sizeof_bits_v<To> == 8) {
    constexpr int kN = decltype(cute::size(src))::value;
    static_assert(kN % 16 == 0 && decltype(cute::size(dst))::value == kN);
    const float* d = src.data();
    std::uint32_t* regs = reinterpret_cast<std::uint32_t*>(cute::raw_pointer_cast(dst.data()));
    CUTE_UNROLL
    for (int reg = 0; reg < kN / 4; ++reg) {
      const int base = reg / 4 * 16;  // the 32-key slice's first accumulator value
      const int a = reg % 4 * 4;      // the register's first A value in the slice
      regs[reg] = arch::pack_e4m3x4(d[base + fp8_p_source(a)], d[base + fp8_p_source(a + 1)],
                                    d[base + fp8_p_source(a + 2)], d[base + fp8_p_source(a + 3)]);
    }
  } else {
    convert_into(dst, src);
  }
}

}  // namespace fa3::hopper
