// The FP8 (e4m3) forward kernels (FA3_GPU_FP8) against fa3::cpu's FP8 path, their
// oracle, and the exact reference of the dequantized inputs, per TESTING.md's FP8 rule:
// inputs are quantized first (normals, some with 0.1 % outliers x10), both references
// are built from the same codes and scales, and the relative error of out
// (‖out − ref‖ / ‖ref‖) is capped per case. Over the shape list, causal and not, MHA /
// GQA / MQA, with block scales and descales, with either alone and with none, bf16 and
// fp16 out. Guards: out and lse start as NaN and every element must be written; the
// inputs' rows are padded with NaN codes and each buffer has a NaN margin, which must not
// reach a result, and the outputs' margins stay untouched; repeated calls are bitwise
// equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "common/numeric.h"
#include "fa3/cpu.h"
#include "fa3/fa3.h"
#include "hopper/fwd_dispatch.h"

namespace fa3::test {
namespace {

constexpr std::uint8_t kNanCode = 0x7f;  // e4m3's NaN
constexpr std::int64_t kRowPad = 16;     // NaN codes after each row of q, k, v
constexpr std::int64_t kMargin = 4096;   // NaN bytes after every buffer
constexpr int kBlockRows = hopper::kFp8BlockRows;

// Which of Fp8Args' scales a case gives.
enum class Scaling { kBlocksAndDescales, kBlocksOnly, kDescalesOnly, kNone };

const char* scaling_name(Scaling s) {
  switch (s) {
    case Scaling::kBlocksAndDescales:
      return "blocks+descales";
    case Scaling::kBlocksOnly:
      return "blocks";
    case Scaling::kDescalesOnly:
      return "descales";
    case Scaling::kNone:
      return "none";
  }
  return "?";
}

struct Fp8Case {
  Shape shape;
  bool causal;
  Scaling scaling;
  bool outliers;
  DType out_dtype;
  // Keys and values whose magnitude changes from one 128-row block to the next (see
  // GrowingMaxAndChangingVScales).
  bool block_gains = false;
  std::int64_t head_dim = 128;
  std::string kernel;  // a tile by name (fa3/kernels.h); empty: fa3::forward's choice
};

// The factor of row s's values under Fp8Case::block_gains: k's last two blocks, which
// the kernel visits first, small and the others large, so that rows' maxima grow after
// the first blocks; v's blocks 1x, 5x, 9x in turn, so that its block scales change.
float block_gain(bool is_k, std::int64_t s, std::int64_t seqlen) {
  const std::int64_t blk = s / kBlockRows, nblocks = (seqlen + kBlockRows - 1) / kBlockRows;
  if (is_k) return blk >= nblocks - 2 ? 0.3f : 2.5f;
  return 1.f + 4.f * static_cast<float>(blk % 3);
}

// One e4m3 tensor (batch, seqlen, heads, d) on the host, rows padded with NaN codes, its
// scales and its dequantized values (dense fp32).
struct Quantized {
  std::int64_t batch, seqlen, heads, d;
  std::vector<std::uint8_t> codes;  // (batch, seqlen, heads, d + kRowPad), then kMargin
  std::vector<float> descale;       // (batch, kv heads)
  std::vector<float> blocks;        // (batch, heads, ceil(seqlen / kBlockRows))
  std::vector<float> dequantized;   // (batch, seqlen, heads, d)

  std::int64_t row_stride() const { return heads * (d + kRowPad); }
  std::int64_t nblocks() const { return (seqlen + kBlockRows - 1) / kBlockRows; }
};

// Quantizes normals (x10 at 0.1 % of the entries with outliers) with absmax scales: per
// block of kBlockRows rows of each (batch, head) with block scales, split with a random
// descale per (batch, kv head) when both are given; per (batch, kv head group) with the
// descale alone; none (the values as codes, N(0, 1) being inside e4m3's range).
// `gains`: 0 none, 1 k's, 2 v's block_gain.
Quantized quantize(std::mt19937_64& rng, const Fp8Case& c, std::int64_t seqlen, std::int64_t heads, std::int64_t group,
                   int gains = 0) {
  const std::int64_t d = c.head_dim;
  Quantized t{c.shape.batch, seqlen, heads, d};
  const std::int64_t heads_kv = heads / group;
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(t.batch * seqlen * heads * d));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::int64_t row = static_cast<std::int64_t>(i) / (heads * d) % seqlen;
    const float gain = gains == 0 ? 1.f : block_gain(gains == 1, row, seqlen);
    x[i] = gain * normal(rng) * (c.outliers && unit(rng) < 1e-3f ? 10.f : 1.f);
  }
  const auto at = [&](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t e) -> float& {
    return x[static_cast<std::size_t>(((b * seqlen + s) * heads + h) * d + e)];
  };
  const bool blocks = c.scaling == Scaling::kBlocksAndDescales || c.scaling == Scaling::kBlocksOnly;
  const bool descales = c.scaling == Scaling::kBlocksAndDescales || c.scaling == Scaling::kDescalesOnly;
  t.descale.assign(static_cast<std::size_t>(t.batch * heads_kv), 1.f);
  t.blocks.assign(static_cast<std::size_t>(t.batch * heads * t.nblocks()), 1.f);
  for (std::int64_t b = 0; b < t.batch; ++b) {
    for (std::int64_t g = 0; g < heads_kv; ++g) {
      float& ds = t.descale[static_cast<std::size_t>(b * heads_kv + g)];
      if (blocks && descales) {
        ds = 0.5f + unit(rng);
      } else if (descales) {
        float absmax = 0.f;
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h)
          for (std::int64_t s = 0; s < seqlen; ++s)
            for (std::int64_t e = 0; e < d; ++e) absmax = std::max(absmax, std::fabs(at(b, s, h, e)));
        ds = absmax / fp8::kE4m3Max;
      }
    }
  }
  t.codes.assign(static_cast<std::size_t>(t.batch * seqlen * t.row_stride() + kMargin), kNanCode);
  t.dequantized.assign(x.size(), 0.f);
  for (std::int64_t b = 0; b < t.batch; ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const float ds = t.descale[static_cast<std::size_t>(b * heads_kv + h / group)];
      for (std::int64_t blk = 0; blk < t.nblocks(); ++blk) {
        const std::int64_t r0 = blk * kBlockRows, r1 = std::min(seqlen, r0 + kBlockRows);
        float& block = t.blocks[static_cast<std::size_t>((b * heads + h) * t.nblocks() + blk)];
        if (blocks) {
          float absmax = 0.f;
          for (std::int64_t s = r0; s < r1; ++s)
            for (std::int64_t e = 0; e < d; ++e) absmax = std::max(absmax, std::fabs(at(b, s, h, e)));
          block = absmax > 0.f ? absmax / fp8::kE4m3Max / ds : 1.f;
        }
        const float scale = ds * block;
        for (std::int64_t s = r0; s < r1; ++s) {
          for (std::int64_t e = 0; e < d; ++e) {
            const std::uint8_t code = numeric::float_to_e4m3(at(b, s, h, e) / scale);
            t.codes[static_cast<std::size_t>(b * seqlen * t.row_stride() + s * t.row_stride() + h * (d + kRowPad) +
                                             e)] = code;
            t.dequantized[static_cast<std::size_t>(((b * seqlen + s) * heads + h) * d + e)] =
                numeric::e4m3_to_float(code) * scale;
          }
        }
      }
    }
  }
  return t;
}

TensorView codes_view(void* data, const Quantized& t) {
  return TensorView::strided(data, DType::kFloat8E4M3, {t.batch, t.seqlen, t.heads, t.d},
                             {t.seqlen * t.row_stride(), t.row_stride(), t.d + kRowPad, 1});
}

// The scales of a case as views of `descale` and `blocks` storage (host or device).
struct ScaleViews {
  TensorView descale, blocks;
};

void set_scales(const Fp8Case& c, const ScaleViews (&v)[3], Fp8Args* f) {
  const bool blocks = c.scaling == Scaling::kBlocksAndDescales || c.scaling == Scaling::kBlocksOnly;
  const bool descales = c.scaling == Scaling::kBlocksAndDescales || c.scaling == Scaling::kDescalesOnly;
  if (descales) {
    f->q_descale = v[0].descale;
    f->k_descale = v[1].descale;
    f->v_descale = v[2].descale;
  }
  if (blocks) {
    f->q_block_scale = v[0].blocks;
    f->k_block_scale = v[1].blocks;
    f->v_block_scale = v[2].blocks;
    f->block_rows = kBlockRows;
  }
}

DeviceBuffer upload(const void* data, std::size_t bytes) {
  DeviceBuffer b(bytes);
  EXPECT_EQ(cudaMemcpy(b.get(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

double norm(const std::vector<double>& x) {
  double s = 0;
  for (double e : x) s += e * e;
  return std::sqrt(s);
}

// ‖a − ref‖ / ‖ref‖ (NaN anywhere gives NaN).
double relative_error(const std::vector<float>& a, const std::vector<float>& ref) {
  std::vector<double> diff(a.size()), r(ref.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff[i] = static_cast<double>(a[i]) - ref[i];
    r[i] = ref[i];
  }
  return norm(diff) / std::max(norm(r), 1e-30);
}

// The outputs of one call, dense fp32 (batch, seqlen_q, heads, d) and (batch, heads,
// seqlen_q).
struct Outputs {
  std::vector<float> out, lse;
};

Outputs host_outputs(const std::vector<std::uint8_t>& out_bytes, DType out_dtype,
                     const std::vector<std::uint8_t>& lse_bytes, std::int64_t out_elems, std::int64_t lse_elems) {
  Outputs o;
  o.out.resize(static_cast<std::size_t>(out_elems));
  for (std::int64_t i = 0; i < out_elems; ++i)
    o.out[static_cast<std::size_t>(i)] = numeric::load_as_float(out_bytes.data(), i, out_dtype);
  o.lse.resize(static_cast<std::size_t>(lse_elems));
  std::memcpy(o.lse.data(), lse_bytes.data(), o.lse.size() * sizeof(float));
  return o;
}

// Elements of the margin after the first `used` that are no longer NaN.
std::int64_t margin_written(const std::vector<std::uint8_t>& bytes, std::int64_t used, DType dtype) {
  std::int64_t written = 0;
  const std::int64_t total = static_cast<std::int64_t>(bytes.size() / dtype_size(dtype));
  for (std::int64_t i = used; i < total; ++i) written += !std::isnan(numeric::load_as_float(bytes.data(), i, dtype));
  return written;
}

// The bound on each row's LSE error (batch, heads_q, seqlen_q): see run_case.
std::vector<double> fp8_lse_bounds(const Quantized& q, const Quantized& k, const Shape& s,
                                   const std::vector<float>& exact_lse) {
  const std::int64_t d = q.d, group = s.nheads_q / s.nheads_kv;
  const auto row_norm = [d](const Quantized& t, std::int64_t b, std::int64_t r, std::int64_t h) {
    double sum = 0;
    for (std::int64_t e = 0; e < d; ++e) {
      const double x = t.dequantized[static_cast<std::size_t>(((b * t.seqlen + r) * t.heads + h) * d + e)];
      sum += x * x;
    }
    return std::sqrt(sum);
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> bound(exact_lse.size());
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t hk = 0; hk < s.nheads_kv; ++hk) {
      double k_max = 0;
      for (std::int64_t j = 0; j < s.seqlen_k; ++j) k_max = std::max(k_max, row_norm(k, b, j, hk));
      for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (std::int64_t r = 0; r < s.seqlen_q; ++r) {
          const std::size_t i = static_cast<std::size_t>((b * s.nheads_q + h) * s.seqlen_q + r);
          const double lse = std::isfinite(exact_lse[i]) ? std::fabs(static_cast<double>(exact_lse[i])) : 0.0;
          bound[i] = 1e-5 + 1e-6 * lse + std::ldexp(scale * row_norm(q, b, r, h) * k_max, -12);
        }
      }
    }
  }
  return bound;
}

// The second mechanism of the FP8 MMA's score error, for rows that break the first
// bound: each group of 32 products (one k32 step) is added after alignment to its
// largest, so that each product of the group may lose up to 2^-13 of that largest. A
// score's error is then at most the sum over groups of 32 * 2^-13 * max |q_i k_i|, and
// the LSE's at most the largest over keys (scaled by softmax_scale). Where one product
// dominates a row (an outlier of q meeting one of k), this exceeds the first bound's
// share of |q| |k|. `dominance`: the largest |q_i k_i| as a share of |q| |k| over the
// row's keys, for the message.
struct AlignmentBound {
  double bound = 0, dominance = 0;
};

AlignmentBound alignment_bound(const Quantized& q, const Quantized& k, const Shape& s, std::size_t row_index) {
  const std::int64_t d = q.d, group = s.nheads_q / s.nheads_kv;
  const std::int64_t r = static_cast<std::int64_t>(row_index) % s.seqlen_q;
  const std::int64_t h = static_cast<std::int64_t>(row_index) / s.seqlen_q % s.nheads_q;
  const std::int64_t b = static_cast<std::int64_t>(row_index) / (s.seqlen_q * s.nheads_q);
  const auto value = [d](const Quantized& t, std::int64_t bb, std::int64_t row, std::int64_t head, std::int64_t e) {
    return static_cast<double>(t.dequantized[static_cast<std::size_t>(((bb * t.seqlen + row) * t.heads + head) * d + e)]);
  };
  AlignmentBound a;
  for (std::int64_t j = 0; j < s.seqlen_k; ++j) {
    double key_error = 0, q_norm = 0, k_norm = 0, largest = 0;
    for (std::int64_t g = 0; g < d; g += 32) {
      double group_largest = 0;
      for (std::int64_t e = g; e < std::min<std::int64_t>(g + 32, d); ++e) {
        const double qe = value(q, b, r, h, e), ke = value(k, b, j, h / group, e);
        group_largest = std::max(group_largest, std::fabs(qe * ke));
        q_norm += qe * qe;
        k_norm += ke * ke;
      }
      key_error += 32 * std::ldexp(group_largest, -13);
      largest = std::max(largest, group_largest);
    }
    a.bound = std::max(a.bound, key_error);
    if (q_norm > 0 && k_norm > 0) a.dominance = std::max(a.dominance, largest / std::sqrt(q_norm * k_norm));
  }
  a.bound /= std::sqrt(static_cast<double>(d));
  return a;
}

std::string name(const Fp8Case& c) {
  const Shape& s = c.shape;
  return "hdim " + std::to_string(c.head_dim) + " batch " + std::to_string(s.batch) + " sq " +
         std::to_string(s.seqlen_q) + " sk " + std::to_string(s.seqlen_k) + " heads " + std::to_string(s.nheads_q) +
         ":" + std::to_string(s.nheads_kv) + (c.causal ? " causal" : "") + " scales " + scaling_name(c.scaling) +
         (c.outliers ? " outliers" : "") + " out " + dtype_name(c.out_dtype) +
         (c.kernel.empty() ? "" : " kernel " + c.kernel);
}

// The call under test: fa3::forward, or the case's kernel.
Status run_call(const Fp8Case& c, const ForwardArgs& a) {
  return c.kernel.empty() ? forward(a, nullptr) : forward_with_kernel(a, c.kernel, nullptr);
}

void run_case(const Fp8Case& c, std::uint64_t seed) {
  const Shape& s = c.shape;
  const std::int64_t d = c.head_dim, group = s.nheads_q / s.nheads_kv;
  std::mt19937_64 rng(seed);
  const Quantized q = quantize(rng, c, s.seqlen_q, s.nheads_q, group);
  const Quantized k = quantize(rng, c, s.seqlen_k, s.nheads_kv, 1, c.block_gains ? 1 : 0);
  const Quantized v = quantize(rng, c, s.seqlen_k, s.nheads_kv, 1, c.block_gains ? 2 : 0);
  const std::int64_t out_elems = s.batch * s.seqlen_q * s.nheads_q * d, lse_elems = s.batch * s.nheads_q * s.seqlen_q;
  const std::size_t out_bytes = static_cast<std::size_t>(out_elems) * dtype_size(c.out_dtype);
  AttentionOptions options;
  options.causal = c.causal;

  // The oracle: fa3::cpu's FP8 path on the same codes and scales.
  const Quantized* qkv[3] = {&q, &k, &v};
  ScaleViews host_scales[3];
  for (int i = 0; i < 3; ++i) {
    const Quantized& t = *qkv[i];
    host_scales[i].descale =
        TensorView::contiguous(const_cast<float*>(t.descale.data()), DType::kFloat32, {t.batch, s.nheads_kv});
    host_scales[i].blocks =
        TensorView::contiguous(const_cast<float*>(t.blocks.data()), DType::kFloat32, {t.batch, t.heads, t.nblocks()});
  }
  std::vector<std::uint8_t> oracle_out(out_bytes);
  std::vector<float> oracle_lse(static_cast<std::size_t>(lse_elems));
  ForwardArgs host;
  host.q = codes_view(const_cast<std::uint8_t*>(q.codes.data()), q);
  host.k = codes_view(const_cast<std::uint8_t*>(k.codes.data()), k);
  host.v = codes_view(const_cast<std::uint8_t*>(v.codes.data()), v);
  host.out = TensorView::contiguous(oracle_out.data(), c.out_dtype, {s.batch, s.seqlen_q, s.nheads_q, d});
  host.lse = TensorView::contiguous(oracle_lse.data(), DType::kFloat32, {s.batch, s.nheads_q, s.seqlen_q});
  host.options = options;
  set_scales(c, host_scales, &host.fp8);
  const Status oracle_status = cpu::forward(host);
  ASSERT_TRUE(oracle_status.is_ok()) << oracle_status.to_string();

  // The exact reference: fa3::cpu in fp32 on the dequantized values.
  std::vector<float> exact_out(static_cast<std::size_t>(out_elems)), exact_lse(static_cast<std::size_t>(lse_elems));
  ForwardArgs exact;
  exact.q = TensorView::contiguous(const_cast<float*>(q.dequantized.data()), DType::kFloat32,
                                   {s.batch, s.seqlen_q, s.nheads_q, d});
  exact.k = TensorView::contiguous(const_cast<float*>(k.dequantized.data()), DType::kFloat32,
                                   {s.batch, s.seqlen_k, s.nheads_kv, d});
  exact.v = TensorView::contiguous(const_cast<float*>(v.dequantized.data()), DType::kFloat32,
                                   {s.batch, s.seqlen_k, s.nheads_kv, d});
  exact.out = TensorView::contiguous(exact_out.data(), DType::kFloat32, {s.batch, s.seqlen_q, s.nheads_q, d});
  exact.lse = TensorView::contiguous(exact_lse.data(), DType::kFloat32, {s.batch, s.nheads_q, s.seqlen_q});
  exact.options = options;
  const Status exact_status = cpu::forward(exact);
  ASSERT_TRUE(exact_status.is_ok()) << exact_status.to_string();

  // The GPU call, on NaN-padded inputs and NaN outputs with NaN margins.
  DeviceBuffer dq = upload(q.codes.data(), q.codes.size()), dk = upload(k.codes.data(), k.codes.size()),
               dv = upload(v.codes.data(), v.codes.size());
  DeviceBuffer scales[3][2];
  ScaleViews dev_scales[3];
  for (int i = 0; i < 3; ++i) {
    const Quantized& t = *qkv[i];
    scales[i][0] = upload(t.descale.data(), t.descale.size() * sizeof(float));
    scales[i][1] = upload(t.blocks.data(), t.blocks.size() * sizeof(float));
    dev_scales[i].descale = TensorView::contiguous(scales[i][0].get(), DType::kFloat32, {t.batch, s.nheads_kv});
    dev_scales[i].blocks = TensorView::contiguous(scales[i][1].get(), DType::kFloat32, {t.batch, t.heads, t.nblocks()});
  }
  DeviceBuffer out(out_bytes + kMargin), lse(static_cast<std::size_t>(lse_elems) * sizeof(float) + kMargin);
  ForwardArgs a = host;
  a.q = codes_view(dq.get(), q);
  a.k = codes_view(dk.get(), k);
  a.v = codes_view(dv.get(), v);
  a.out = TensorView::contiguous(out.get(), c.out_dtype, {s.batch, s.seqlen_q, s.nheads_q, d});
  a.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {s.batch, s.nheads_q, s.seqlen_q});
  a.fp8 = Fp8Args{};
  set_scales(c, dev_scales, &a.fp8);
  // Vᵀ goes into the caller's workspace: without one the call is refused, nothing written.
  // Kernels that transpose V in shared memory need none.
  std::size_t workspace_bytes = 0;
  const Status sized = forward_workspace_size(a, &workspace_bytes);
  ASSERT_TRUE(sized.is_ok()) << sized.to_string();
  if (hopper::fwd_fp8_vt_in_smem()) {
    ASSERT_EQ(workspace_bytes, 0u);
  } else {
    ASSERT_GT(workspace_bytes, 0u);
    fill_nan(out.get(), c.out_dtype, static_cast<std::int64_t>(out.bytes() / dtype_size(c.out_dtype)));
    const std::vector<std::uint8_t> untouched = out.to_host();
    const Status refused = run_call(c, a);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
    EXPECT_EQ(refused.message().rfind("workspace: data pointer is null", 0), 0u) << refused.message();
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(out.to_host() == untouched) << "a refused call wrote out";
  }
  DeviceBuffer workspace(workspace_bytes);
  a.workspace = workspace.get();
  a.workspace_bytes = workspace_bytes;

  std::vector<std::uint8_t> first_out, first_lse;
  for (int run = 0; run < 3; ++run) {
    fill_nan(out.get(), c.out_dtype, static_cast<std::int64_t>(out.bytes() / dtype_size(c.out_dtype)));
    fill_nan(lse.get(), DType::kFloat32, static_cast<std::int64_t>(lse.bytes() / sizeof(float)));
    // The workspace's contents on entry do not matter.
    fill_nan(workspace.get(), DType::kFloat32, static_cast<std::int64_t>(workspace_bytes / sizeof(float)));
    const Status st = run_call(c, a);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<std::uint8_t> got_out = out.to_host(), got_lse = lse.to_host();
    if (run > 0) {
      EXPECT_TRUE(got_out == first_out && got_lse == first_lse) << "run " << run << " differs from the first";
      continue;
    }
    first_out = got_out;
    first_lse = got_lse;
    EXPECT_EQ(margin_written(got_out, out_elems, c.out_dtype), 0) << "out written past its end";
    EXPECT_EQ(margin_written(got_lse, lse_elems, DType::kFloat32), 0) << "lse written past its end";
    const Outputs gpu = host_outputs(got_out, c.out_dtype, got_lse, out_elems, lse_elems);
    const Outputs oracle =
        host_outputs(oracle_out, c.out_dtype,
                     std::vector<std::uint8_t>(
                         reinterpret_cast<const std::uint8_t*>(oracle_lse.data()),
                         reinterpret_cast<const std::uint8_t*>(oracle_lse.data()) + oracle_lse.size() * sizeof(float)),
                     out_elems, lse_elems);
    std::int64_t nan_out = 0;
    for (float x : gpu.out) nan_out += std::isnan(x);
    EXPECT_EQ(nan_out, 0) << "out elements left NaN (unwritten, or NaN computed)";
    // The kernel's error against the exact result, next to the oracle's: the oracle
    // rounds P against a running max over 64-key tiles visited first to last, the
    // kernel over 128-key blocks visited last to first, so their roundings differ and
    // each errs about as much (TESTING.md's "2x the low-precision reference" applied to
    // FP8); and the FP8 rule's cap, 4e-2 (tests/cpu/reference/test_fp8.cpp says why).
    const double err = relative_error(gpu.out, exact_out);
    const double oracle_err = relative_error(oracle.out, exact_out);
    EXPECT_LE(err, 2 * oracle_err + 1e-3) << "oracle's error " << oracle_err;
    EXPECT_LE(err, 4e-2);
    EXPECT_FALSE(std::isnan(err));
    // LSE comes from unrounded sums, but the scores behind it do not: Hopper's FP8 MMA
    // keeps about 14 bits while it accumulates (the DeepSeek-V3 report measured it), so
    // a score errs by up to a few units of 2^-14 of sum_i |q_i k_i|, and the LSE, a soft
    // maximum of the scores, by at most the largest score error. Per row: 2^-12 of
    // softmax_scale * |q_r| * max_j |k_j| (Cauchy-Schwarz over the head's keys), plus the
    // fp32 exp2/log2 of the final statistics; a row past it may add the group-alignment
    // term (alignment_bound), computed only for such rows as it costs a pass over keys.
    const std::vector<double> lse_bound = fp8_lse_bounds(q, k, s, exact_lse);
    double worst = 0;
    std::size_t worst_row = 0, aligned_rows = 0;
    AlignmentBound worst_alignment;
    for (std::size_t i = 0; i < gpu.lse.size(); ++i) {
      const float g = gpu.lse[i], r = exact_lse[i];
      const double e = std::isinf(r) && g == r ? 0.0 : std::fabs(static_cast<double>(g) - r);
      double bound = lse_bound[i];
      AlignmentBound alignment;
      if (!(e <= bound)) {
        alignment = alignment_bound(q, k, s, i);
        bound += alignment.bound;
        ++aligned_rows;
      }
      const double ratio = std::isnan(e) ? INFINITY : e / bound;
      if (ratio > worst) worst = ratio, worst_row = i, worst_alignment = alignment;
    }
    EXPECT_LE(worst, 1.0) << "largest |lse - exact lse| as a fraction of its row's bound (row " << worst_row
                          << ": |lse error| "
                          << std::fabs(static_cast<double>(gpu.lse[worst_row]) - exact_lse[worst_row])
                          << ", first bound " << lse_bound[worst_row] << ", group-alignment term "
                          << worst_alignment.bound << ", largest product / (|q| |k|) " << worst_alignment.dominance
                          << "); rows past the first bound: " << aligned_rows;
    // For the record of how often the second term is needed (docs/perf-log.md).
    if (aligned_rows > 0) {
      std::printf("[fp8 lse] %s: %zu of %zu rows past the first bound, worst |error| / bound %.3f\n", name(c).c_str(),
                  aligned_rows, gpu.lse.size(), worst);
    }
  }
}

// The head dims of the FP8 kernels built with an O of `out_dtype`.
std::vector<std::int64_t> built_head_dims(DType out_dtype) {
  std::vector<std::int64_t> dims;
  if (!hopper::fwd_fp8_enabled()) return dims;
  for (const hopper::FwdKernelEntry& k : hopper::fwd_kernels()) {
    if (k.dtype == DType::kFloat8E4M3 && k.out_dtype == out_dtype &&
        std::find(dims.begin(), dims.end(), k.head_dim) == dims.end()) {
      dims.push_back(k.head_dim);
    }
  }
  return dims;
}

// Per built head dim: the shape list, causal and not, block scales with descales,
// outliers every other case. At the first: lengths that end inside a 16-key group and
// a block, and long rows, with each kind of scaling; and head dims between the built
// ones, which run on the next one up (its extra columns read as zeros).
std::vector<Fp8Case> cases() {
  std::vector<Fp8Case> all;
  const DType out = DType::kBFloat16;
  const std::vector<std::int64_t> dims = built_head_dims(out);
  if (dims.empty()) return all;
  int i = 0;
  for (const std::int64_t d : dims) {
    for (const Shape& s : accuracy_shapes()) {
      for (bool causal : {false, true}) {
        all.push_back({s, causal, Scaling::kBlocksAndDescales, i++ % 2 == 0, out, false, d});
      }
    }
  }
  const Shape extra[] = {{2, 1000, 1000, 8, 2}, {1, 2055, 2055, 4, 1}, {1, 113, 2055, 2, 2}, {3, 1, 1000, 8, 8}};
  for (const Shape& s : extra) {
    for (bool causal : {false, true}) {
      for (Scaling scaling :
           {Scaling::kBlocksAndDescales, Scaling::kBlocksOnly, Scaling::kDescalesOnly, Scaling::kNone}) {
        all.push_back({s, causal, scaling, true, out, false, dims.front()});
      }
    }
  }
  // Halfway between each built head dim and the next narrower one (0 below the first),
  // in whole 16-byte rows: 32, 80, 112, 160 and 224 with every head dim built.
  std::vector<std::int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  std::int64_t narrower = 0;
  for (const std::int64_t wider : sorted) {
    const std::int64_t d = (narrower + wider) / 2 / 16 * 16;
    narrower = wider;
    if (d == 0 || std::find(dims.begin(), dims.end(), d) != dims.end()) continue;
    for (bool causal : {false, true}) {
      all.push_back({{2, 239, 799, 8, 2}, causal, Scaling::kBlocksAndDescales, true, out, false, d});
    }
  }
  return all;
}

// Whether this build runs e4m3 calls with out in `dtype` at head dim 128.
bool built(DType out_dtype) {
  const std::vector<std::int64_t> dims = built_head_dims(out_dtype);
  return std::find(dims.begin(), dims.end(), 128) != dims.end();
}

TEST(Fp8ForwardKernel, MatchesTheCpuPathOverTheShapeList) {
  FA3_REQUIRE_HOPPER();
  if (built_head_dims(DType::kBFloat16).empty())
    GTEST_SKIP() << "no FP8 kernel with bf16 out (FA3_GPU_FP8, FA3_DTYPES)";
  std::uint64_t seed = 1;
  for (const Fp8Case& c : cases()) {
    SCOPED_TRACE(name(c));
    run_case(c, seed++);
  }
}

TEST(Fp8ForwardKernel, Fp16Out) {
  FA3_REQUIRE_HOPPER();
  if (!built(DType::kFloat16)) GTEST_SKIP() << "no FP8 kernel with fp16 out at head dim 128 (FA3_GPU_FP8, FA3_DTYPES)";
  std::uint64_t seed = 900;
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{2, 239, 799, 8, 2}, Shape{1, 1025, 1025, 4, 4}}) {
      const Fp8Case c{s, causal, Scaling::kBlocksAndDescales, true, DType::kFloat16};
      SCOPED_TRACE(name(c));
      run_case(c, seed++);
    }
  }
}

// Every FP8 tile of a build with several at one head dim and mask (FA3_FP8_FWD_TILES_*),
// each by name on the calls it takes: a tile whose blocks do not divide the block
// scales' 128 rows (e.g. 128x224) runs calls with descales or no scales only. (A tile
// alone at its head dim and mask runs every call: the shape list above covers it.)
// Lengths that end inside a key block and a 16-key group, a short query block, GQA.
TEST(Fp8ForwardKernel, EveryBuiltTile) {
  FA3_REQUIRE_HOPPER();
  if (built_head_dims(DType::kBFloat16).empty())
    GTEST_SKIP() << "no FP8 kernel with bf16 out (FA3_GPU_FP8, FA3_DTYPES)";
  const auto fp8_bf16 = [](const hopper::FwdKernelEntry& k) {
    return k.dtype == DType::kFloat8E4M3 && k.out_dtype == DType::kBFloat16;
  };
  std::uint64_t seed = 7000;
  int tiles = 0;
  for (const hopper::FwdKernelEntry& k : hopper::fwd_kernels()) {
    if (!fp8_bf16(k)) continue;
    const auto same_family = std::count_if(
        hopper::fwd_kernels().begin(), hopper::fwd_kernels().end(), [&](const hopper::FwdKernelEntry& e) {
          return fp8_bf16(e) && e.head_dim == k.head_dim && e.head_dim_v == k.head_dim_v && e.mask == k.mask;
        });
    if (same_family == 1) continue;
    ++tiles;
    const bool causal = k.mask == hopper::MaskKind::kCausal;
    for (Scaling scaling : {Scaling::kBlocksAndDescales, Scaling::kDescalesOnly, Scaling::kNone}) {
      if (scaling == Scaling::kBlocksAndDescales && !k.takes_fp8_block_scales()) continue;
      for (const Shape& s : {Shape{2, 1000, 1000, 8, 2}, Shape{1, 113, 2055, 2, 2}, Shape{1, 1100, 1100, 4, 1}}) {
        const Fp8Case c{s, causal, scaling, true, DType::kBFloat16, false, k.head_dim, k.name()};
        SCOPED_TRACE(name(c));
        run_case(c, seed++);
      }
    }
  }
  if (tiles == 0) GTEST_SKIP() << "one FP8 tile per head dim and mask in this build (FA3_FP8_FWD_TILES_*)";
}

// Rows' maxima grow after the first key blocks visited, so that O is rescaled, while
// V's block scales change from block to block (block_gain), with block scales alone and
// with descales too; and with descales alone, where a lazy softmax reference
// (FA3_FP8_LEAN_HEAD_DIMS) moves only on such growth.
TEST(Fp8ForwardKernel, GrowingMaxAndChangingVScales) {
  FA3_REQUIRE_HOPPER();
  if (!built(DType::kBFloat16)) GTEST_SKIP() << "no FP8 kernel with bf16 out at head dim 128 (FA3_GPU_FP8, FA3_DTYPES)";
  std::uint64_t seed = 4242;
  for (bool causal : {false, true}) {
    for (Scaling scaling : {Scaling::kBlocksAndDescales, Scaling::kBlocksOnly, Scaling::kDescalesOnly}) {
      const Fp8Case c{{1, 700, 900, 4, 2}, causal, scaling, false, DType::kBFloat16, true};
      SCOPED_TRACE(name(c) + " block gains");
      run_case(c, seed++);
    }
  }
}

// v with its keys contiguous (FlashAttention-3's V_colmajor): the transpose into the
// workspace reads it along its keys, or TMA lands it as Vᵀ for the transpose in shared
// memory, and the result is bitwise the row-major v's. Its rows of keys are 1008 codes
// apart (16-byte multiples, which TMA needs); with the transpose in shared memory a v of
// 1000-code rows is refused, naming the stride, with nothing written. At every built
// head dim: the kernels transpose with two warps or three (Traits::kTransposeWarps).
void check_v_with_its_keys_contiguous(std::int64_t d) {
  SCOPED_TRACE("hdim " + std::to_string(d));
  const std::int64_t b = 2, sq = 300, sk = 1000, sk_row = 1008, hq = 8, hkv = 2;
  std::mt19937_64 rng(77);
  std::normal_distribution<float> normal;
  auto codes = [&](std::int64_t n) {
    std::vector<std::uint8_t> c(static_cast<std::size_t>(n));
    for (std::uint8_t& x : c) x = numeric::float_to_e4m3(normal(rng));
    return c;
  };
  const std::vector<std::uint8_t> q = codes(b * sq * hq * d), k = codes(b * sk * hkv * d), v = codes(b * sk * hkv * d);
  // The same values in (b, h, d, s) storage: seqlen innermost, rows of sk_row codes whose
  // last ones are NaN.
  std::vector<std::uint8_t> v_cols(static_cast<std::size_t>(b * hkv * d * sk_row), 0x7f);
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t s = 0; s < sk; ++s)
      for (std::int64_t h = 0; h < hkv; ++h)
        for (std::int64_t e = 0; e < d; ++e)
          v_cols[static_cast<std::size_t>(((i * hkv + h) * d + e) * sk_row + s)] =
              v[static_cast<std::size_t>(((i * sk + s) * hkv + h) * d + e)];
  DeviceBuffer dq = upload(q.data(), q.size()), dk = upload(k.data(), k.size()), dv = upload(v.data(), v.size()),
               dv_cols = upload(v_cols.data(), v_cols.size());
  DeviceBuffer out(static_cast<std::size_t>(b * sq * hq * d) * 2), lse(static_cast<std::size_t>(b * hq * sq) * 4);
  for (bool causal : {false, true}) {
    ForwardArgs a;
    a.q = TensorView::contiguous(dq.get(), DType::kFloat8E4M3, {b, sq, hq, d});
    a.k = TensorView::contiguous(dk.get(), DType::kFloat8E4M3, {b, sk, hkv, d});
    a.out = TensorView::contiguous(out.get(), DType::kBFloat16, {b, sq, hq, d});
    a.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {b, hq, sq});
    a.options.causal = causal;
    std::vector<std::uint8_t> results[2], lses[2];
    for (int layout = 0; layout < 2; ++layout) {
      a.v = layout == 0 ? TensorView::contiguous(dv.get(), DType::kFloat8E4M3, {b, sk, hkv, d})
                        : TensorView::strided(dv_cols.get(), DType::kFloat8E4M3, {b, sk, hkv, d},
                                              {hkv * d * sk_row, 1, d * sk_row, sk_row});
      std::size_t bytes = 0;
      ASSERT_TRUE(forward_workspace_size(a, &bytes).is_ok());
      DeviceBuffer workspace(bytes);
      a.workspace = workspace.get();
      a.workspace_bytes = bytes;
      fill_nan(out.get(), DType::kBFloat16, b * sq * hq * d);
      fill_nan(lse.get(), DType::kFloat32, b * hq * sq);
      const Status st = forward(a, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      FA3_CUDA_CHECK(cudaDeviceSynchronize());
      results[layout] = out.to_host();
      lses[layout] = lse.to_host();
    }
    // Both written in full (no NaN left of the poison), and bitwise the same.
    std::int64_t nan_out = 0;
    for (std::size_t i = 0; i + 1 < results[0].size(); i += 2) {
      const unsigned bits = results[0][i] | (results[0][i + 1] << 8);  // bf16, little-endian
      nan_out += (bits & 0x7F80u) == 0x7F80u && (bits & 0x7Fu) != 0;
    }
    EXPECT_EQ(nan_out, 0) << (causal ? "causal" : "plain") << ": out elements left unwritten";
    EXPECT_TRUE(results[0] == results[1]) << (causal ? "causal" : "plain") << ": the layouts' results differ";
    EXPECT_TRUE(lses[0] == lses[1]) << (causal ? "causal" : "plain") << ": the layouts' lse differ";
    if (hopper::fwd_fp8_vt_in_smem()) {
      a.v = TensorView::strided(dv_cols.get(), DType::kFloat8E4M3, {b, sk, hkv, d}, {hkv * d * sk, 1, d * sk, sk});
      a.workspace = nullptr;
      a.workspace_bytes = 0;
      fill_nan(out.get(), DType::kBFloat16, b * sq * hq * d);
      const std::vector<std::uint8_t> untouched = out.to_host();
      const Status refused = forward(a, nullptr);
      EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
      EXPECT_EQ(refused.message().rfind("v: stride 1000 of dim 3", 0), 0u) << refused.message();
      FA3_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(out.to_host() == untouched) << "a refused call wrote out";
    }
  }
}

TEST(Fp8ForwardKernel, VWithItsKeysContiguousGivesTheSameBytes) {
  FA3_REQUIRE_HOPPER();
  const std::vector<std::int64_t> dims = built_head_dims(DType::kBFloat16);
  if (dims.empty()) GTEST_SKIP() << "no FP8 kernel with bf16 out (FA3_GPU_FP8, FA3_DTYPES)";
  for (const std::int64_t d : dims) check_v_with_its_keys_contiguous(d);
}

}  // namespace
}  // namespace fa3::test
