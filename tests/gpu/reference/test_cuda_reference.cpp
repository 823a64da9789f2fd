// The CUDA reference (the oracle of the kernel tests) against the fp64 CPU reference:
// the forward, the backward in both precisions, and the backward on long sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <vector>

#include "common/gpu_test_util.h"
#include "api/validate.h"
#include "common/numeric.h"
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

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

template <class A, class B>
double max_abs_error(const std::vector<A>& got, const std::vector<B>& want) {
  EXPECT_EQ(got.size(), want.size());
  double m = 0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (std::isnan(e)) return INFINITY;
    m = std::max(m, e);
  }
  return m;
}

struct Case {
  std::int64_t sq, sk, hq, hkv, d;
  bool causal;
  int window_left, window_right;
  float softcap;
  float softmax_scale = 0.f;
  std::int64_t dv = 0;  // v's head dim; 0: d
  int chunk = 0;

  std::int64_t value_dim() const { return dv > 0 ? dv : d; }
};

// Masks of every kind, rows that see no key (113 queries, 17 keys, causal), GQA and MQA,
// head dims up to 256 and one no kernel has, softcaps that bend the scores hard and barely;
// V head dims of their own: DeepSeek-V3's (192, 128), (64, 256) and (64, 512) past the
// q rows' 256, and (40, 24); chunks alone, causal with more queries than keys (the
// first queries' chunks hold no key), and under a window that crosses chunk edges.
const Case kCases[] = {{1, 1, 2, 2, 64, false, -1, -1, 0},
                       {17, 113, 4, 2, 128, true, -1, -1, 0},
                       {113, 17, 4, 1, 96, true, -1, -1, 0},
                       {129, 129, 2, 2, 256, false, 16, 8, 0},
                       {64, 200, 2, 1, 192, false, -1, -1, 30},
                       {77, 77, 3, 3, 40, true, 20, -1, 5},
                       {33, 65, 4, 2, 64, false, -1, -1, 0.5f, 0.3f},
                       {64, 113, 4, 2, 192, true, -1, -1, 0, 0.f, 128},
                       {129, 65, 2, 1, 64, false, -1, -1, 0, 0.f, 256},
                       {33, 77, 2, 2, 64, true, 10, -1, 0, 0.f, 512},
                       {77, 40, 3, 1, 40, false, 9, 4, 2.f, 0.f, 24},
                       {70, 70, 2, 2, 64, false, -1, -1, 0, 0.f, 0, 7},
                       {113, 90, 4, 2, 128, true, -1, -1, 0, 0.f, 0, 16},
                       {90, 130, 2, 1, 64, false, 20, 5, 0, 0.f, 0, 32}};

Problem problem_of(const Case& c, const TensorView& q, const TensorView& k, const TensorView& v) {
  ForwardArgs args;
  args.q = q;
  args.k = k;
  args.v = v;
  args.out = q;  // shape only: validation needs one, with v's head dim
  args.out.shape[3] = v.shape[3];
  args.options.causal = c.causal;
  args.options.window_left = c.window_left;
  args.options.window_right = c.causal ? -1 : c.window_right;
  args.options.softcap = c.softcap;
  args.options.softmax_scale = c.softmax_scale;
  args.options.attention_chunk = c.chunk;
  Problem p;
  const Status st = validate_forward(args, cpu_target(), &p);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return p;
}

TEST(CudaReference, MatchesFp64Reference) {
  if (!current_device().present) GTEST_SKIP() << "needs a CUDA GPU";
  for (const Case& c : kCases) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " sq " << c.sq << " sk " << c.sk << " d " << c.d
                                      << " dv " << c.value_dim());
      PaddedTensor q = make_tensor(dtype, 2, c.sq, c.hq, c.d, 1);
      PaddedTensor k = make_tensor(dtype, 2, c.sk, c.hkv, c.d, 2);
      PaddedTensor v = make_tensor(dtype, 2, c.sk, c.hkv, c.value_dim(), 3);
      const Problem p = problem_of(c, q.view, k.view, v.view);

      const std::int64_t n_out = 2 * c.sq * c.hq * c.value_dim(), n_lse = 2 * c.hq * c.sq;
      DeviceBuffer out(static_cast<std::size_t>(n_out) * 4), lse(static_cast<std::size_t>(n_lse) * 4);
      ASSERT_TRUE(reference::cuda_forward(p, q.view, k.view, v.view, nullptr, static_cast<float*>(out.get()),
                                          static_cast<float*>(lse.get()), reference::Precision::kExact, nullptr)
                      .is_ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      HostCopy hq = to_host(q.view), hk = to_host(k.view), hv = to_host(v.view);
      const reference::ForwardResult ref = reference::forward(p, hq.view, hk.view, hv.view);
      const std::vector<float> got_out = floats_of(out), got_lse = floats_of(lse);
      double lse_err = 0;
      for (std::int64_t i = 0; i < n_lse; ++i) {
        const float f = got_lse[static_cast<std::size_t>(i)];
        const double r = ref.lse[static_cast<std::size_t>(i)];
        lse_err = std::max(lse_err, (std::isinf(r) && f == r) ? 0.0 : std::fabs(f - r));
      }
      // fp32 accumulation over at most a few hundred terms of size ~1.
      EXPECT_LT(max_abs_error(got_out, ref.out), 2e-5);
      EXPECT_LT(lse_err, 2e-5);
    }
  }
}

// The gradients of one case from the CUDA reference, dense fp32 (dq, dk, dv).
std::array<std::vector<float>, kGradients> cuda_gradients(const Problem& p, const TensorView& q, const TensorView& k,
                                                         const TensorView& v, const TensorView& dout,
                                                         reference::Precision precision) {
  DeviceBuffer dq(static_cast<std::size_t>(p.batch * p.seqlen_q * p.nheads_q * p.head_dim) * 4);
  DeviceBuffer dk(static_cast<std::size_t>(p.batch * p.seqlen_k * p.nheads_kv * p.head_dim) * 4);
  DeviceBuffer dv(static_cast<std::size_t>(p.batch * p.seqlen_k * p.nheads_kv * p.head_dim_v) * 4);
  const Status st =
      reference::cuda_backward(p, q, k, v, nullptr, dout, static_cast<float*>(dq.get()), static_cast<float*>(dk.get()),
                               static_cast<float*>(dv.get()), nullptr, precision, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {floats_of(dq), floats_of(dk), floats_of(dv)};
}

std::array<std::vector<double>, kGradients> as_array(const reference::BackwardResult& r) { return {r.dq, r.dk, r.dv}; }

// fp32 sums of a few hundred terms against fp64, relative to the gradient's size. A
// wrong term (a missing scale or softcap slope, a dropped key, a group not summed) errs
// by a good fraction of it.
constexpr double kFp32GradientTolerance = 2e-5;

// Exact mode against the fp64 CPU reference; rounding like the inputs against the CPU
// reference's own rounding mode: both round the same intermediates, so both stray from
// the exact gradients by about as much (a reference that rounded nothing, or more,
// would not). Inputs have NaN rows between batches, and fp16 ones NaN after each row.
TEST(CudaReference, BackwardMatchesFp64Reference) {
  if (!current_device().present) GTEST_SKIP() << "needs a CUDA GPU";
  for (const Case& c : kCases) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " sq " << c.sq << " sk " << c.sk << " heads " << c.hq
                                      << ":" << c.hkv << " d " << c.d << " dv " << c.value_dim());
      const std::int64_t pad = dtype == DType::kFloat16 ? 8 : 0;
      PaddedTensor q = make_tensor(dtype, 2, c.sq, c.hq, c.d, 1, pad, 3);
      PaddedTensor k = make_tensor(dtype, 2, c.sk, c.hkv, c.d, 2, pad, 3);
      PaddedTensor v = make_tensor(dtype, 2, c.sk, c.hkv, c.value_dim(), 3, pad, 3);
      PaddedTensor dout = make_tensor(dtype, 2, c.sq, c.hq, c.value_dim(), 4, pad, 3);
      const Problem p = problem_of(c, q.view, k.view, v.view);
      const auto exact = cuda_gradients(p, q.view, k.view, v.view, dout.view, reference::Precision::kExact);
      const auto low = cuda_gradients(p, q.view, k.view, v.view, dout.view, reference::Precision::kLikeInputs);

      HostCopy hq = to_host(q.view), hk = to_host(k.view), hv = to_host(v.view), hd = to_host(dout.view);
      const auto cpu = as_array(reference::backward(p, hq.view, hk.view, hv.view, hd.view));
      const auto cpu_low =
          as_array(reference::backward(p, hq.view, hk.view, hv.view, hd.view, reference::Precision::kLikeInputs));
      for (int g = 0; g < kGradients; ++g) {
        SCOPED_TRACE(kGradientNames[g]);
        const double size = std::max(1.0, max_abs(cpu[g]));
        EXPECT_LE(max_abs_error(exact[g], cpu[g]), kFp32GradientTolerance * size);
        const double low_err = max_abs_error(low[g], cpu[g]);
        if (dtype == DType::kFloat32) {
          EXPECT_LE(low_err, kFp32GradientTolerance * size) << "fp32 inputs: nothing to round";
          continue;
        }
        const double cpu_low_err = max_abs_error(cpu_low[g], cpu[g]);
        EXPECT_GE(low_err, 0.5 * cpu_low_err);
        EXPECT_LE(low_err, 2 * cpu_low_err);
      }
    }
  }
}

// dq of one query row in fp64 from host copies, from the definition (the softmax
// recomputed from scratch); no softcap.
std::vector<double> exact_dq_row(const Problem& p, const HostCopy& q, const HostCopy& k, const HostCopy& v,
                                 const HostCopy& dout, std::int64_t b, std::int64_t h, std::int64_t i) {
  const std::int64_t d = p.head_dim, hk = h / p.group_size();
  auto at = [&](const HostCopy& t, std::int64_t row, std::int64_t head, std::int64_t e) {
    const TensorView& x = t.view;
    return static_cast<double>(
        numeric::load_as_float(x.data, b * x.stride[0] + row * x.stride[1] + head * x.stride[2] + e, x.dtype));
  };
  const std::int64_t first = p.first_key(i), last = p.last_key(i);
  std::vector<double> s, dp;
  for (std::int64_t j = first; j <= last; ++j) {
    double dot = 0, dov = 0;
    for (std::int64_t e = 0; e < d; ++e) {
      dot += at(q, i, h, e) * at(k, j, hk, e);
      dov += at(dout, i, h, e) * at(v, j, hk, e);
    }
    s.push_back(dot * p.softmax_scale);
    dp.push_back(dov);
  }
  std::vector<double> dq(static_cast<std::size_t>(d), 0.0);
  if (s.empty()) return dq;
  const double m = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double x : s) sum += std::exp(x - m);
  double delta = 0;  // dout . out = sum_j P_j dP_j
  for (std::size_t n = 0; n < s.size(); ++n) delta += std::exp(s[n] - m) / sum * dp[n];
  for (std::size_t n = 0; n < s.size(); ++n) {
    const double ds = std::exp(s[n] - m) / sum * (dp[n] - delta) * p.softmax_scale;
    const std::int64_t j = first + static_cast<std::int64_t>(n);
    for (std::int64_t e = 0; e < d; ++e) dq[static_cast<std::size_t>(e)] += ds * at(k, j, hk, e);
  }
  return dq;
}

// The largest shape of the kernel tests, in both precisions, in seconds. Too large for
// the CPU reference, so checked by what holds exactly for any inputs (without softcap,
// every key seen): the rows of dS sum to zero, so dk summed over the keys is zero, and
// the rows of P sum to one, so dv summed over the keys is dout summed over the queries of
// the group; and dq on sampled rows against fp64.
TEST(CudaReference, BackwardOfLongSequencesInSeconds) {
  if (!current_device().present) GTEST_SKIP() << "needs a CUDA GPU";
  const Case c{4224, 4224, 8, 2, 256, false, -1, -1, 0};
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    PaddedTensor q = make_tensor(DType::kBFloat16, 1, c.sq, c.hq, c.d, 11);
    PaddedTensor k = make_tensor(DType::kBFloat16, 1, c.sk, c.hkv, c.d, 12);
    PaddedTensor v = make_tensor(DType::kBFloat16, 1, c.sk, c.hkv, c.d, 13);
    PaddedTensor dout = make_tensor(DType::kBFloat16, 1, c.sq, c.hq, c.d, 14);
    Case with_mask = c;
    with_mask.causal = causal;
    const Problem p = problem_of(with_mask, q.view, k.view, v.view);

    const auto start = std::chrono::steady_clock::now();
    const auto g = cuda_gradients(p, q.view, k.view, v.view, dout.view, reference::Precision::kExact);
    cuda_gradients(p, q.view, k.view, v.view, dout.view, reference::Precision::kLikeInputs);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 30.0) << "both precisions took " << seconds << " s";

    const std::vector<float> dout_dense = dense_host(dout.view);
    const std::int64_t group = c.hq / c.hkv;
    for (std::int64_t hk = 0; hk < c.hkv; ++hk) {
      for (std::int64_t e = 0; e < c.d; ++e) {
        double dk_sum = 0, dk_mass = 0, dv_sum = 0, dv_mass = 0, dout_sum = 0;
        for (std::int64_t j = 0; j < c.sk; ++j) {
          const std::size_t at = static_cast<std::size_t>((j * c.hkv + hk) * c.d + e);
          dk_sum += g[1][at];
          dk_mass += std::fabs(g[1][at]);
          dv_sum += g[2][at];
          dv_mass += std::fabs(g[2][at]);
        }
        for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          for (std::int64_t i = 0; i < c.sq; ++i) {
            dout_sum += dout_dense[static_cast<std::size_t>((i * c.hq + h) * c.d + e)];
          }
        }
        ASSERT_LE(std::fabs(dk_sum), 1e-4 * dk_mass) << "kv head " << hk << " element " << e;
        ASSERT_LE(std::fabs(dv_sum - dout_sum), 1e-4 * dv_mass) << "kv head " << hk << " element " << e;
      }
    }

    HostCopy hq = to_host(q.view), hk = to_host(k.view), hv = to_host(v.view), hd = to_host(dout.view);
    for (std::int64_t i : {std::int64_t{0}, std::int64_t{1}, std::int64_t{2047}, std::int64_t{4223}}) {
      for (std::int64_t h : {std::int64_t{0}, std::int64_t{5}}) {
        const std::vector<double> want = exact_dq_row(p, hq, hk, hv, hd, 0, h, i);
        const std::size_t first = static_cast<std::size_t>((i * c.hq + h) * c.d);
        const std::vector<float> got(g[0].begin() + first, g[0].begin() + first + c.d);
        EXPECT_LE(max_abs_error(got, want), kFp32GradientTolerance * std::max(1.0, max_abs(want)))
            << "dq row " << i << " head " << h;
      }
    }
  }
}

}  // namespace
}  // namespace fa3::test
