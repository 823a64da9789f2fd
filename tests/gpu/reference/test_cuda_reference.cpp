// The CUDA reference (the oracle of the kernel tests) against the fp64 CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/gpu_test_util.h"
#include "api/validate.h"
#include "reference/cuda_reference.h"
#include "reference/naive.h"

namespace fa3::test {
namespace {

// Copies a device view to a host buffer with the same strides, so the CPU reference
// reads exactly what the GPU reads.
struct HostCopy {
  std::vector<std::uint8_t> bytes;
  TensorView view;
};

HostCopy to_host(const TensorView& v) {
  HostCopy h;
  h.bytes.resize(static_cast<std::size_t>(span_elements(v)) * dtype_size(v.dtype));
  EXPECT_EQ(cudaMemcpy(h.bytes.data(), v.data, h.bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  h.view = v;
  h.view.data = h.bytes.data();
  return h;
}

TEST(CudaReference, MatchesFp64Reference) {
  if (!current_device().present) GTEST_SKIP() << "needs a CUDA GPU";
  struct Case {
    std::int64_t sq, sk, hq, hkv, d;
    bool causal;
    int window_left, window_right;
    float softcap;
  };
  const Case cases[] = {{1, 1, 2, 2, 64, false, -1, -1, 0},     {17, 113, 4, 2, 128, true, -1, -1, 0},
                        {113, 17, 4, 1, 96, true, -1, -1, 0},   {129, 129, 2, 2, 256, false, 16, 8, 0},
                        {64, 200, 2, 1, 192, false, -1, -1, 30}, {77, 77, 3, 3, 40, true, 20, -1, 5}};
  for (const Case& c : cases) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " sq " << c.sq << " sk " << c.sk << " d " << c.d);
      PaddedTensor q = make_tensor(dtype, 2, c.sq, c.hq, c.d, 1);
      PaddedTensor k = make_tensor(dtype, 2, c.sk, c.hkv, c.d, 2);
      PaddedTensor v = make_tensor(dtype, 2, c.sk, c.hkv, c.d, 3);
      ForwardArgs args;
      args.q = q.view;
      args.k = k.view;
      args.v = v.view;
      args.out = q.view;  // shape only: validation needs one
      args.options.causal = c.causal;
      args.options.window_left = c.window_left;
      args.options.window_right = c.causal ? -1 : c.window_right;
      args.options.softcap = c.softcap;
      Problem p;
      ASSERT_TRUE(validate_forward(args, cpu_target(), &p).is_ok());

      const std::int64_t n_out = 2 * c.sq * c.hq * c.d, n_lse = 2 * c.hq * c.sq;
      DeviceBuffer out(static_cast<std::size_t>(n_out) * 4), lse(static_cast<std::size_t>(n_lse) * 4);
      ASSERT_TRUE(reference::cuda_forward(p, q.view, k.view, v.view, static_cast<float*>(out.get()),
                                          static_cast<float*>(lse.get()), reference::Precision::kExact, nullptr)
                      .is_ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      HostCopy hq = to_host(q.view), hk = to_host(k.view), hv = to_host(v.view);
      const reference::ForwardResult ref = reference::forward(p, hq.view, hk.view, hv.view);
      auto got_out = out.to_host();
      auto got_lse = lse.to_host();
      double err = 0, lse_err = 0;
      for (std::int64_t i = 0; i < n_out; ++i) {
        float f;
        std::memcpy(&f, got_out.data() + 4 * i, 4);
        err = std::max(err, std::fabs(f - ref.out[static_cast<std::size_t>(i)]));
      }
      for (std::int64_t i = 0; i < n_lse; ++i) {
        float f;
        std::memcpy(&f, got_lse.data() + 4 * i, 4);
        const double r = ref.lse[static_cast<std::size_t>(i)];
        lse_err = std::max(lse_err, (std::isinf(r) && f == r) ? 0.0 : std::fabs(f - r));
      }
      // fp32 accumulation over at most a few hundred terms of size ~1.
      EXPECT_LT(err, 2e-5);
      EXPECT_LT(lse_err, 2e-5);
    }
  }
}

}  // namespace
}  // namespace fa3::test
