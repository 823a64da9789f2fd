// Valid FP8 (e4m3) forward arguments over real host buffers, with every scale of
// Fp8Args given, for tests that break one FP8 rule at a time.
#pragma once

#include <cstdint>

#include "fa3/attention.h"
#include "valid_args.h"

namespace fa3::test {

// valid_args.h's shape (batch 2, seqlen_q 64, seqlen_k 96, 4 query heads on 2 KV heads,
// head dim 128) in e4m3, out bf16, and blocks of 32 rows: q_block_scale (2, 4, 2),
// k_block_scale and v_block_scale (2, 2, 3), each descale (2, 2). block_rows is not the
// GPU's 128, so that the device-like target can refuse it by that rule alone.
class ValidFp8Args {
 public:
  static constexpr int kBlockRows = 32;

  ValidFp8Args()
      : valid_(e4m3_shape()),
        out_(static_cast<std::size_t>(2 * 64 * 4 * 128) * 2),
        q_descale_(bytes(2 * 2)),
        k_descale_(bytes(2 * 2)),
        v_descale_(bytes(2 * 2)),
        q_blocks_(bytes(2 * 4 * 2)),
        k_blocks_(bytes(2 * 2 * 3)),
        v_blocks_(bytes(2 * 2 * 3)) {}

  ForwardArgs forward() const {
    ForwardArgs a = valid_.forward();
    a.out = TensorView::contiguous(out_.data(), DType::kBFloat16, {2, 64, 4, 128});
    a.fp8.q_descale = TensorView::contiguous(q_descale_.data(), DType::kFloat32, {2, 2});
    a.fp8.k_descale = TensorView::contiguous(k_descale_.data(), DType::kFloat32, {2, 2});
    a.fp8.v_descale = TensorView::contiguous(v_descale_.data(), DType::kFloat32, {2, 2});
    a.fp8.q_block_scale = TensorView::contiguous(q_blocks_.data(), DType::kFloat32, {2, 4, 2});
    a.fp8.k_block_scale = TensorView::contiguous(k_blocks_.data(), DType::kFloat32, {2, 2, 3});
    a.fp8.v_block_scale = TensorView::contiguous(v_blocks_.data(), DType::kFloat32, {2, 2, 3});
    a.fp8.block_rows = kBlockRows;
    return a;
  }

  HostBuffer& out() { return out_; }
  HostBuffer& lse() { return valid_.lse(); }

 private:
  static ArgsShape e4m3_shape() {
    ArgsShape s;
    s.dtype = DType::kFloat8E4M3;
    return s;
  }
  static std::size_t bytes(std::int64_t floats) { return static_cast<std::size_t>(floats) * sizeof(float); }

  ValidArgs valid_;
  HostBuffer out_, q_descale_, k_descale_, v_descale_, q_blocks_, k_blocks_, v_blocks_;
};

}  // namespace fa3::test
