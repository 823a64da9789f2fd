// The FP8 (e4m3) forward kernels on variable-length batches (FA3_GPU_FP8_VARLEN), against
// fa3::cpu's FP8 varlen path (the oracle, which equals each sequence run alone: tests/cpu/
// reference/test_fp8_varlen.cpp) and fa3::cpu in fp32 on the dequantized values, by
// TESTING.md's FP8 rule over the rows that take part in a sequence: the kernel errs at
// most twice as much as the oracle against the exact result (and under 4e-2), and each
// row's lse within the bound of tests/gpu/hopper/test_fwd_fp8.cpp's first mechanism. Per
// sequence scales: descales (batch, nheads_kv) and block scales of 128 rows counted from
// each sequence's first row. Guards: NaN codes in every row no sequence uses, which must
// reach no result; out and lse NaN on entry, every row written (the rows of no sequence
// with 0 and -inf); the margins untouched; the workspace NaN on entry; repeated calls
// bitwise equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
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
#include "hopper/varlen_batch.h"

namespace fa3::test {
namespace {

constexpr std::uint8_t kNanCode = 0x7f;  // e4m3's NaN
constexpr std::int64_t kMargin = 4096;   // NaN bytes after every buffer
constexpr int kBlockRows = hopper::kFp8BlockRows;

// Lengths that start and end on and off the 16-key groups and 128-row blocks, empty
// sequences on either side, and seqused.
std::vector<Mix> mixes() {
  return {
      {"boundaries", {{127, 127}, {128, 128}, {129, 129}, {64, 300}, {256, 80}, {3, 17}}},
      {"zero_lengths", {{0, 0}, {5, 0}, {0, 7}, {113, 239}, {1, 1024}}},
      {"seqused", {{130, 140, 128, 129}, {17, 300, 0, 257}, {200, 150, 177, 150}, {9, 9, 1, 9}}, true},
  };
}

struct Fp8VarlenCase {
  const Mix* mix;
  std::int64_t head_dim;
  std::int64_t heads_q, heads_kv;
  bool causal;
  bool block_scales;
};

std::string name(const Fp8VarlenCase& c) {
  return std::string(c.mix->name) + " hdim " + std::to_string(c.head_dim) + " heads " + std::to_string(c.heads_q) +
         ":" + std::to_string(c.heads_kv) + (c.causal ? " causal" : "") +
         (c.block_scales ? " blocks+descales" : " descales");
}

// One packed e4m3 tensor (total, heads, d) on the host: codes (NaN in the rows no
// sequence uses, then kMargin NaN bytes) and their values in fp32 with the scales.
struct Packed {
  std::int64_t total, heads, d;
  std::vector<std::uint8_t> codes;
  std::vector<float> values;
};

Packed make_packed(std::mt19937_64& rng, std::int64_t total, std::int64_t heads, std::int64_t d,
                   const std::vector<std::int32_t>& cu, const std::vector<std::int32_t>& used) {
  Packed t{total, heads, d};
  t.codes.assign(static_cast<std::size_t>(total * heads * d + kMargin), kNanCode);
  t.values.assign(static_cast<std::size_t>(total * heads * d), NAN);
  std::normal_distribution<float> normal;
  for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
    for (std::int64_t r = cu[b]; r < cu[b] + used[b]; ++r) {
      for (std::int64_t i = r * heads * d; i < (r + 1) * heads * d; ++i) {
        t.codes[static_cast<std::size_t>(i)] = numeric::float_to_e4m3(normal(rng));
      }
    }
  }
  return t;
}

// Multiplies the used rows' values by their sequence's descale (batch, kv head) and,
// with `blocks`, block scale (batch, head, row / 128 within the sequence).
void scale_values(Packed& t, const std::vector<std::int32_t>& cu, const std::vector<std::int32_t>& used,
                  const std::vector<float>& descale, std::int64_t heads_kv, const std::vector<float>* blocks,
                  std::int64_t nblocks) {
  const std::int64_t group = t.heads / heads_kv;
  for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
    for (std::int64_t r = 0; r < used[b]; ++r) {
      for (std::int64_t h = 0; h < t.heads; ++h) {
        float scale = descale[b * heads_kv + h / group];
        if (blocks != nullptr) scale *= (*blocks)[(b * t.heads + h) * nblocks + r / kBlockRows];
        for (std::int64_t e = 0; e < t.d; ++e) {
          const std::size_t i = static_cast<std::size_t>(((cu[b] + r) * t.heads + h) * t.d + e);
          t.values[i] = numeric::e4m3_to_float(t.codes[i]) * scale;
        }
      }
    }
  }
}

std::vector<float> random_scales(std::mt19937_64& rng, std::size_t n) {
  std::uniform_real_distribution<float> unit(0.5f, 1.5f);
  std::vector<float> s(n);
  for (float& x : s) x = unit(rng);
  return s;
}

DeviceBuffer upload(const void* data, std::size_t bytes) {
  DeviceBuffer b(bytes);
  EXPECT_EQ(cudaMemcpy(b.get(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

double relative_error(const std::vector<double>& a, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - ref[i]) * (a[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

void run_case(const Fp8VarlenCase& c, std::uint64_t seed) {
  const VarlenIndex index(*c.mix);
  const std::int64_t batch = static_cast<std::int64_t>(index.used_q.size());
  const std::int64_t d = c.head_dim, hq = c.heads_q, hkv = c.heads_kv;
  const std::int64_t q_blocks = (index.max_q + kBlockRows - 1) / kBlockRows;
  const std::int64_t k_blocks = (index.max_k + kBlockRows - 1) / kBlockRows;
  std::mt19937_64 rng(seed);
  Packed q = make_packed(rng, index.total_q, hq, d, index.cu_q, index.used_q);
  Packed k = make_packed(rng, index.total_k, hkv, d, index.cu_k, index.used_k);
  Packed v = make_packed(rng, index.total_k, hkv, d, index.cu_k, index.used_k);
  const std::vector<float> descales[3] = {random_scales(rng, batch * hkv), random_scales(rng, batch * hkv),
                                          random_scales(rng, batch * hkv)};
  const std::vector<float> blocks[3] = {random_scales(rng, batch * hq * q_blocks),
                                        random_scales(rng, batch * hkv * k_blocks),
                                        random_scales(rng, batch * hkv * k_blocks)};
  scale_values(q, index.cu_q, index.used_q, descales[0], hkv, c.block_scales ? &blocks[0] : nullptr, q_blocks);
  scale_values(k, index.cu_k, index.used_k, descales[1], hkv, c.block_scales ? &blocks[1] : nullptr, k_blocks);
  scale_values(v, index.cu_k, index.used_k, descales[2], hkv, c.block_scales ? &blocks[2] : nullptr, k_blocks);

  const std::int64_t out_elems = index.total_q * hq * d, lse_elems = hq * index.total_q;
  using Pointers = std::array<void*, 3>;
  const auto set_scales = [&](Fp8Args* f, const Pointers& descale, const Pointers& block) {
    f->q_descale = TensorView::contiguous(descale[0], DType::kFloat32, {batch, hkv});
    f->k_descale = TensorView::contiguous(descale[1], DType::kFloat32, {batch, hkv});
    f->v_descale = TensorView::contiguous(descale[2], DType::kFloat32, {batch, hkv});
    if (!c.block_scales) return;
    f->q_block_scale = TensorView::contiguous(block[0], DType::kFloat32, {batch, hq, q_blocks});
    f->k_block_scale = TensorView::contiguous(block[1], DType::kFloat32, {batch, hkv, k_blocks});
    f->v_block_scale = TensorView::contiguous(block[2], DType::kFloat32, {batch, hkv, k_blocks});
    f->block_rows = kBlockRows;
  };
  AttentionOptions options;
  options.causal = c.causal;

  // The host calls: the index tensors' host copies.
  std::vector<std::int32_t> cu_q = index.cu_q, cu_k = index.cu_k, used_q = index.used_q, used_k = index.used_k;
  VarlenArgs host_varlen;
  host_varlen.cu_seqlens_q = TensorView::contiguous(cu_q.data(), DType::kInt32, {batch + 1});
  host_varlen.cu_seqlens_k = TensorView::contiguous(cu_k.data(), DType::kInt32, {batch + 1});
  if (index.varlen.seqused_q.defined()) {
    host_varlen.seqused_q = TensorView::contiguous(used_q.data(), DType::kInt32, {batch});
    host_varlen.seqused_k = TensorView::contiguous(used_k.data(), DType::kInt32, {batch});
  }
  host_varlen.max_seqlen_q = index.max_q;
  host_varlen.max_seqlen_k = index.max_k;
  std::vector<std::uint16_t> oracle_out(static_cast<std::size_t>(out_elems));
  std::vector<float> oracle_lse(static_cast<std::size_t>(lse_elems)), exact_out(oracle_out.size()),
      exact_lse(oracle_lse.size());
  ForwardArgs oracle;
  oracle.q = TensorView::contiguous(q.codes.data(), DType::kFloat8E4M3, {index.total_q, hq, d});
  oracle.k = TensorView::contiguous(k.codes.data(), DType::kFloat8E4M3, {index.total_k, hkv, d});
  oracle.v = TensorView::contiguous(v.codes.data(), DType::kFloat8E4M3, {index.total_k, hkv, d});
  oracle.out = TensorView::contiguous(oracle_out.data(), DType::kBFloat16, {index.total_q, hq, d});
  oracle.lse = TensorView::contiguous(oracle_lse.data(), DType::kFloat32, {hq, index.total_q});
  oracle.options = options;
  oracle.varlen = host_varlen;
  std::vector<float> host_descales[3] = {descales[0], descales[1], descales[2]};
  std::vector<float> host_blocks[3] = {blocks[0], blocks[1], blocks[2]};
  set_scales(&oracle.fp8, Pointers{host_descales[0].data(), host_descales[1].data(), host_descales[2].data()},
             Pointers{host_blocks[0].data(), host_blocks[1].data(), host_blocks[2].data()});
  const Status oracle_status = cpu::forward(oracle);
  ASSERT_TRUE(oracle_status.is_ok()) << oracle_status.to_string();
  ForwardArgs exact = oracle;
  exact.q = TensorView::contiguous(q.values.data(), DType::kFloat32, {index.total_q, hq, d});
  exact.k = TensorView::contiguous(k.values.data(), DType::kFloat32, {index.total_k, hkv, d});
  exact.v = TensorView::contiguous(v.values.data(), DType::kFloat32, {index.total_k, hkv, d});
  exact.out = TensorView::contiguous(exact_out.data(), DType::kFloat32, {index.total_q, hq, d});
  exact.lse = TensorView::contiguous(exact_lse.data(), DType::kFloat32, {hq, index.total_q});
  exact.fp8 = Fp8Args{};
  const Status exact_status = cpu::forward(exact);
  ASSERT_TRUE(exact_status.is_ok()) << exact_status.to_string();

  // The GPU call.
  DeviceBuffer dq = upload(q.codes.data(), q.codes.size()), dk = upload(k.codes.data(), k.codes.size()),
               dv = upload(v.codes.data(), v.codes.size());
  DeviceBuffer scale_bufs[6];
  for (int i = 0; i < 3; ++i) {
    scale_bufs[i] = upload(descales[i].data(), descales[i].size() * sizeof(float));
    scale_bufs[3 + i] = upload(blocks[i].data(), blocks[i].size() * sizeof(float));
  }
  DeviceBuffer out(static_cast<std::size_t>(out_elems) * 2 + kMargin);
  DeviceBuffer lse(static_cast<std::size_t>(lse_elems) * sizeof(float) + kMargin);
  ForwardArgs a = oracle;
  a.q = TensorView::contiguous(dq.get(), DType::kFloat8E4M3, {index.total_q, hq, d});
  a.k = TensorView::contiguous(dk.get(), DType::kFloat8E4M3, {index.total_k, hkv, d});
  a.v = TensorView::contiguous(dv.get(), DType::kFloat8E4M3, {index.total_k, hkv, d});
  a.out = TensorView::contiguous(out.get(), DType::kBFloat16, {index.total_q, hq, d});
  a.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {hq, index.total_q});
  a.varlen = index.varlen;
  a.fp8 = Fp8Args{};
  set_scales(&a.fp8, Pointers{scale_bufs[0].get(), scale_bufs[1].get(), scale_bufs[2].get()},
             Pointers{scale_bufs[3].get(), scale_bufs[4].get(), scale_bufs[5].get()});
  std::size_t workspace_bytes = 0;
  const Status sized = forward_workspace_size(a, &workspace_bytes);
  ASSERT_TRUE(sized.is_ok()) << sized.to_string();
  DeviceBuffer workspace(workspace_bytes);
  a.workspace = workspace.get();
  a.workspace_bytes = workspace_bytes;

  // Which rows take part: sequence b's first used rows.
  std::vector<bool> q_used(static_cast<std::size_t>(index.total_q), false);
  for (std::size_t b = 0; b < index.used_q.size(); ++b) {
    for (std::int32_t r = 0; r < index.used_q[b]; ++r) q_used[static_cast<std::size_t>(index.cu_q[b] + r)] = true;
  }

  std::vector<std::uint8_t> first_out, first_lse;
  for (int run = 0; run < 3; ++run) {
    fill_nan(out.get(), DType::kBFloat16, static_cast<std::int64_t>(out.bytes() / 2));
    fill_nan(lse.get(), DType::kFloat32, static_cast<std::int64_t>(lse.bytes() / sizeof(float)));
    fill_nan(workspace.get(), DType::kFloat32, static_cast<std::int64_t>(workspace_bytes / sizeof(float)));
    const Status st = forward(a, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<std::uint8_t> got_out = out.to_host(), got_lse = lse.to_host();
    if (run > 0) {
      EXPECT_TRUE(got_out == first_out && got_lse == first_lse) << "run " << run << " differs from the first";
      continue;
    }
    first_out = got_out;
    first_lse = got_lse;
    for (std::int64_t i = out_elems; i < static_cast<std::int64_t>(got_out.size() / 2); ++i) {
      ASSERT_TRUE(std::isnan(numeric::load_as_float(got_out.data(), i, DType::kBFloat16))) << "out's margin written";
    }
    for (std::int64_t i = lse_elems; i < static_cast<std::int64_t>(got_lse.size() / 4); ++i) {
      ASSERT_TRUE(std::isnan(numeric::load_as_float(got_lse.data(), i, DType::kFloat32))) << "lse's margin written";
    }
    std::vector<double> gpu, ref, exact_used;
    for (std::int64_t i = 0; i < out_elems; ++i) {
      const float x = numeric::load_as_float(got_out.data(), i, DType::kBFloat16);
      const std::int64_t row = i / (hq * d);
      if (!q_used[static_cast<std::size_t>(row)]) {
        ASSERT_EQ(x, 0.f) << "row " << row << " of no sequence";
        continue;
      }
      ASSERT_FALSE(std::isnan(x)) << "row " << row << " left NaN";
      gpu.push_back(x);
      ref.push_back(numeric::load_as_float(oracle_out.data(), i, DType::kBFloat16));
      exact_used.push_back(exact_out[static_cast<std::size_t>(i)]);
    }
    const double err = relative_error(gpu, exact_used), oracle_err = relative_error(ref, exact_used);
    EXPECT_LE(err, 2 * oracle_err + 1e-3) << "oracle's error " << oracle_err;
    EXPECT_LE(err, 4e-2);
    // lse per row: exact where the row sees no key (-inf), else within the first
    // mechanism's bound: 1e-5 + 1e-6 |lse| + 2^-12 softmax_scale |q_r| max_j |k_j| over
    // the sequence's keys.
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const auto row_norm = [d](const Packed& t, std::int64_t row, std::int64_t h) {
      double s = 0;
      for (std::int64_t e = 0; e < d; ++e) {
        const double x = t.values[static_cast<std::size_t>((row * t.heads + h) * d + e)];
        s += x * x;
      }
      return std::sqrt(s);
    };
    for (std::size_t b = 0; b < index.used_q.size(); ++b) {
      for (std::int64_t h = 0; h < hq; ++h) {
        double k_max = 0;
        for (std::int32_t j = 0; j < index.used_k[b]; ++j) {
          k_max = std::max(k_max, row_norm(k, index.cu_k[b] + j, h / (hq / hkv)));
        }
        for (std::int32_t r = 0; r < index.used_q[b]; ++r) {
          const std::int64_t row = index.cu_q[b] + r;
          const std::size_t i = static_cast<std::size_t>(h * index.total_q + row);
          const float g = numeric::load_as_float(got_lse.data(), static_cast<std::int64_t>(i), DType::kFloat32);
          const float want = exact_lse[i];
          if (std::isinf(want)) {
            ASSERT_EQ(g, want) << "sequence " << b << " row " << r << " head " << h;
            continue;
          }
          const double bound = 1e-5 + 1e-6 * std::fabs(want) + std::ldexp(scale * row_norm(q, row, h) * k_max, -12);
          ASSERT_LE(std::fabs(static_cast<double>(g) - want), bound)
              << "sequence " << b << " row " << r << " head " << h;
        }
      }
    }
    for (std::int64_t row = 0; row < index.total_q; ++row) {
      if (q_used[static_cast<std::size_t>(row)]) continue;
      for (std::int64_t h = 0; h < hq; ++h) {
        ASSERT_EQ(numeric::load_as_float(got_lse.data(), h * index.total_q + row, DType::kFloat32), -INFINITY)
            << "row " << row << " of no sequence";
      }
    }
  }
}

// The head dims of the FP8 kernels with bf16 out.
std::vector<std::int64_t> built_head_dims() {
  std::vector<std::int64_t> dims;
  for (const hopper::FwdKernelEntry& k : hopper::fwd_kernels()) {
    if (k.dtype == DType::kFloat8E4M3 && k.out_dtype == DType::kBFloat16 &&
        std::find(dims.begin(), dims.end(), k.head_dim) == dims.end()) {
      dims.push_back(k.head_dim);
    }
  }
  return dims;
}

// Every mix at every built head dim, causal and not, GQA with block scales and MQA with
// descales alone.
TEST(Fp8VarlenForwardKernel, MatchesTheCpuPath) {
  FA3_REQUIRE_HOPPER();
  if (!hopper::fwd_fp8_varlen_enabled()) GTEST_SKIP() << "varlen e4m3 calls are off in this build (FA3_GPU_FP8_VARLEN)";
  const std::vector<std::int64_t> dims = built_head_dims();
  if (dims.empty()) GTEST_SKIP() << "no FP8 kernel with bf16 out (FA3_GPU_FP8, FA3_DTYPES)";
  const std::vector<Mix> all = mixes();
  std::uint64_t seed = 31;
  for (const std::int64_t d : dims) {
    for (const Mix& mix : all) {
      for (bool causal : {false, true}) {
        for (bool block_scales : {true, false}) {
          const Fp8VarlenCase c{&mix, d, 8, block_scales ? std::int64_t{2} : std::int64_t{1}, causal, block_scales};
          SCOPED_TRACE(name(c));
          run_case(c, seed++);
        }
      }
    }
  }
}

}  // namespace
}  // namespace fa3::test
