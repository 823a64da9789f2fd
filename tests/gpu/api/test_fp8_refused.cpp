// In a build without the FP8 forward kernels (FA3_GPU_FP8 off), fa3::forward refuses an
// FP8 (e4m3) call whose arguments are otherwise valid and in device memory with
// kNotSupported naming q, and writes nothing (fa3::cpu::forward runs e4m3 inputs). With
// them or without, a call that breaks a rule gets that rule's message.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/fa3.h"
#include "hopper/fwd_dispatch.h"

namespace fa3::test {
namespace {

TEST(Fp8Refused, ForwardRefusesE4m3NamingQ) {
  FA3_REQUIRE_HOPPER();
  const std::int64_t b = 2, s = 256, hq = 4, hkv = 2, d = 128;
  DeviceBuffer q(b * s * hq * d), k(b * s * hkv * d), v(b * s * hkv * d), out(b * s * hq * d * 2),
      lse(b * hq * s * sizeof(float)), descale(b * hkv * sizeof(float)), q_blocks(b * hq * 2 * sizeof(float)),
      kv_blocks(b * hkv * 2 * sizeof(float));
  fill_nan(out.get(), DType::kBFloat16, b * s * hq * d);
  fill_nan(lse.get(), DType::kFloat32, b * hq * s);
  ForwardArgs a;
  a.q = TensorView::contiguous(q.get(), DType::kFloat8E4M3, {b, s, hq, d});
  a.k = TensorView::contiguous(k.get(), DType::kFloat8E4M3, {b, s, hkv, d});
  a.v = TensorView::contiguous(v.get(), DType::kFloat8E4M3, {b, s, hkv, d});
  a.out = TensorView::contiguous(out.get(), DType::kBFloat16, {b, s, hq, d});
  a.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {b, hq, s});
  a.fp8.q_descale = a.fp8.k_descale = a.fp8.v_descale =
      TensorView::contiguous(descale.get(), DType::kFloat32, {b, hkv});
  a.fp8.q_block_scale = TensorView::contiguous(q_blocks.get(), DType::kFloat32, {b, hq, 2});
  a.fp8.k_block_scale = a.fp8.v_block_scale = TensorView::contiguous(kv_blocks.get(), DType::kFloat32, {b, hkv, 2});
  const std::vector<std::uint8_t> out_before = out.to_host(), lse_before = lse.to_host();

  Status st;
  if (!hopper::fwd_fp8_enabled()) {
    st = forward(a, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kNotSupported);
    EXPECT_EQ(st.message(),
              "q: dtype e4m3 (FP8) is not supported on the GPU yet: the FP8 kernel does not exist (fa3::cpu::forward "
              "runs e4m3 inputs)");
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(out.to_host(), out_before);
    EXPECT_EQ(lse.to_host(), lse_before);
  }

  a.fp8.block_rows = 64;  // the scales are for 128-row blocks
  st = forward(a, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  a.fp8.block_rows = 128;
  a.fp8.q_descale = TensorView::contiguous(descale.get(), DType::kFloat32, {b, hq});
  st = forward(a, nullptr);
  EXPECT_EQ(st.message(), "q_descale: shape (2, 4) must be (batch, nheads_kv) = (2, 2)");
}

}  // namespace
}  // namespace fa3::test
