// The GPU entry points refuse a variable-length call, whose arguments are otherwise
// valid and in device memory, with kNotSupported naming cu_seqlens_q, and write nothing,
// in a build with the GPU varlen paths switched off (FA3_GPU_VARLEN; with it on,
// tests/gpu/hopper/test_fwd_varlen.cpp and test_bwd_varlen.cpp run them). fa3::cpu runs
// varlen calls.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/fa3.h"
#include "hopper/bwd_dispatch.h"
#include "hopper/fwd_dispatch.h"

namespace fa3::test {
namespace {

const char* const kRefusal = "cu_seqlens_q: variable-length batches (varlen) are not implemented on the GPU yet";

// Two sequences of 5 and 7 query rows over 6 and 9 keys, 4 query heads on 2, in device
// memory; every output NaN before the call.
struct DeviceVarlen {
  static constexpr std::int64_t kTotalQ = 12, kTotalK = 15, kHeadsQ = 4, kHeadsKv = 2;
  DType dtype;
  std::int64_t head_dim;
  DeviceBuffer q, k, v, out, lse, dout, dq, dk, dv, cu_q, cu_k;

  DeviceVarlen(DType dt, std::int64_t d)
      : dtype(dt),
        head_dim(d),
        q(rows(kTotalQ, kHeadsQ)),
        k(rows(kTotalK, kHeadsKv)),
        v(rows(kTotalK, kHeadsKv)),
        out(rows(kTotalQ, kHeadsQ)),
        lse(kHeadsQ * kTotalQ * sizeof(float)),
        dout(rows(kTotalQ, kHeadsQ)),
        dq(rows(kTotalQ, kHeadsQ)),
        dk(rows(kTotalK, kHeadsKv)),
        dv(rows(kTotalK, kHeadsKv)),
        cu_q(3 * sizeof(std::int32_t)),
        cu_k(3 * sizeof(std::int32_t)) {
    const std::int32_t offsets_q[] = {0, 5, 12}, offsets_k[] = {0, 6, 15};
    EXPECT_EQ(cudaMemcpy(cu_q.get(), offsets_q, sizeof offsets_q, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(cu_k.get(), offsets_k, sizeof offsets_k, cudaMemcpyHostToDevice), cudaSuccess);
    // The inputs' values do not matter: the call is refused before any kernel runs.
    for (DeviceBuffer* b : {&out, &dq, &dk, &dv}) fill_nan(b->get(), dtype, elements(*b));
    fill_nan(lse.get(), DType::kFloat32, kHeadsQ * kTotalQ);
  }

  std::size_t rows(std::int64_t total, std::int64_t heads) const {
    return static_cast<std::size_t>(total * heads * head_dim) * dtype_size(dtype);
  }
  std::int64_t elements(const DeviceBuffer& b) const {
    return static_cast<std::int64_t>(b.bytes() / dtype_size(dtype));
  }
  TensorView view(const DeviceBuffer& b, std::int64_t total, std::int64_t heads) const {
    return TensorView::contiguous(b.get(), dtype, {total, heads, head_dim});
  }

  VarlenArgs varlen() const {
    VarlenArgs v;
    v.cu_seqlens_q = TensorView::contiguous(cu_q.get(), DType::kInt32, {3});
    v.cu_seqlens_k = TensorView::contiguous(cu_k.get(), DType::kInt32, {3});
    v.max_seqlen_q = 7;
    v.max_seqlen_k = 9;
    return v;
  }

  ForwardArgs forward() const {
    ForwardArgs a;
    a.q = view(q, kTotalQ, kHeadsQ);
    a.k = view(k, kTotalK, kHeadsKv);
    a.v = view(v, kTotalK, kHeadsKv);
    a.out = view(out, kTotalQ, kHeadsQ);
    a.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {kHeadsQ, kTotalQ});
    a.varlen = varlen();
    return a;
  }

  BackwardArgs backward() const {
    BackwardArgs a;
    a.q = view(q, kTotalQ, kHeadsQ);
    a.k = view(k, kTotalK, kHeadsKv);
    a.v = view(v, kTotalK, kHeadsKv);
    a.out = view(out, kTotalQ, kHeadsQ);
    a.dout = view(dout, kTotalQ, kHeadsQ);
    a.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {kHeadsQ, kTotalQ});
    a.dq = view(dq, kTotalQ, kHeadsQ);
    a.dk = view(dk, kTotalK, kHeadsKv);
    a.dv = view(dv, kTotalK, kHeadsKv);
    a.varlen = varlen();
    return a;
  }
};

void expect_refused(const Status& s) {
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.to_string();
  EXPECT_EQ(s.message(), kRefusal);
}

TEST(GpuVarlen, ForwardRefusesAndWritesNothing) {
  FA3_REQUIRE_HOPPER();
  if (hopper::fwd_dtypes().empty()) GTEST_SKIP() << "no forward kernels were built";
  if (hopper::fwd_varlen_enabled()) GTEST_SKIP() << "the GPU varlen forward is switched on (FA3_GPU_VARLEN)";
  DeviceVarlen d(hopper::fwd_dtypes().front(), hopper::fwd_head_dims().front());
  const std::vector<std::uint8_t> out_before = d.out.to_host(), lse_before = d.lse.to_host();
  expect_refused(forward(d.forward(), nullptr));
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d.out.to_host(), out_before);
  EXPECT_EQ(d.lse.to_host(), lse_before);
}

TEST(GpuVarlen, BackwardAndItsSizeQueryRefuseAndWriteNothing) {
  FA3_REQUIRE_HOPPER();
  if (hopper::bwd_dtypes().empty()) GTEST_SKIP() << "no backward kernels were built";
  if (hopper::bwd_varlen_enabled()) GTEST_SKIP() << "the GPU varlen backward is switched on (FA3_GPU_VARLEN)";
  DeviceVarlen d(hopper::bwd_dtypes().front(), hopper::bwd_head_dims().front());
  const std::vector<std::uint8_t> dq_before = d.dq.to_host(), dk_before = d.dk.to_host(), dv_before = d.dv.to_host();
  std::size_t bytes = 0;
  expect_refused(backward_workspace_size(d.backward(), &bytes));
  expect_refused(backward(d.backward(), nullptr));
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d.dq.to_host(), dq_before);
  EXPECT_EQ(d.dk.to_host(), dk_before);
  EXPECT_EQ(d.dv.to_host(), dv_before);
}

}  // namespace
}  // namespace fa3::test
