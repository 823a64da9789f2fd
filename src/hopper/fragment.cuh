// fa3 — views of wgmma accumulator fragments.
//
// A thread's share of an m64nN accumulator is laid out ((2, 2, N/8), MMA_M, MMA_N):
// two adjacent columns, two rows 8 apart, N/8 column groups 8 apart. Softmax wants it
// as (rows, cols); the P·V GEMM wants the same registers as its A operand
// ((2, 2, 2), MMA_M, N/16), which for 16-bit types is a pure re-view: value order
// (column pair, row half, column group) matches the A fragment's (k pair, row half,
// k half) order.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

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

}  // namespace fa3::hopper
