// fa3::cpu::quantize (fa3/fp8.h): the transform keeps q . k, its signs come from the
// seed alone, the codes and scales follow the definition, a varlen batch quantizes each
// sequence as if alone, and each rule of a call is refused with its message, nothing
// written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "common/numeric.h"
#include "fa3/fp8.h"
#include "host_tensor.h"
#include "reference/fp8_quantize.h"

namespace fa3::testing {
namespace {

std::vector<float> normals(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(Hadamard, BlockSizeIsTheLargestPowerOfTwoDivisor) {
  EXPECT_EQ(fp8::hadamard_size(64), 64);
  EXPECT_EQ(fp8::hadamard_size(96), 32);
  EXPECT_EQ(fp8::hadamard_size(128), 128);
  EXPECT_EQ(fp8::hadamard_size(192), 64);
  EXPECT_EQ(fp8::hadamard_size(256), 256);
}

// Transforming q and k with one seed keeps every q . k to fp32 rounding (a few ulps of
// the sum of |q_i k_i|), keeps each row's norm, and spreads a one-hot row evenly over
// its block: the transform is orthogonal.
TEST(Hadamard, PreservesDotProductsAndNorms) {
  for (const int d : {64, 96, 128, 192, 256}) {
    SCOPED_TRACE(d);
    for (std::uint64_t seed : {0ull, 1ull, 12345ull}) {
      std::vector<float> q = normals(static_cast<std::size_t>(d), seed * 3 + 1);
      std::vector<float> k = normals(static_cast<std::size_t>(d), seed * 3 + 2);
      double dot = 0, mag = 0, qq = 0;
      for (int i = 0; i < d; ++i) {
        dot += double(q[i]) * k[i];
        mag += std::fabs(double(q[i]) * k[i]);
        qq += double(q[i]) * q[i];
      }
      reference::hadamard_rotate(q.data(), d, seed);
      reference::hadamard_rotate(k.data(), d, seed);
      double dot_t = 0, qq_t = 0;
      for (int i = 0; i < d; ++i) {
        dot_t += double(q[i]) * k[i];
        qq_t += double(q[i]) * q[i];
      }
      EXPECT_NEAR(dot_t, dot, 8 * std::log2(d) * std::ldexp(1.0, -24) * mag);
      EXPECT_NEAR(qq_t, qq, 8 * std::log2(d) * std::ldexp(1.0, -24) * qq);
    }
    std::vector<float> one_hot(static_cast<std::size_t>(d), 0.f);
    one_hot[3] = 1.f;
    reference::hadamard_rotate(one_hot.data(), d, 9);
    const int n = fp8::hadamard_size(d);
    for (int i = 0; i < d; ++i) {
      EXPECT_NEAR(std::fabs(one_hot[static_cast<std::size_t>(i)]), i < n ? 1.0 / std::sqrt(n) : 0.0, 1e-7) << i;
    }
  }
}

// The signs are a function of (seed, column) only: the same on every call, different
// between seeds, about half negative, and pinned so that a change of the hash (which
// would change every quantized tensor) is noticed.
TEST(Hadamard, SignsAreReproducibleBySeed) {
  int negative = 0, differ = 0;
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(fp8::hadamard_sign(42, c), fp8::hadamard_sign(42, c));
    negative += fp8::hadamard_sign(42, c);
    differ += fp8::hadamard_sign(42, c) != fp8::hadamard_sign(43, c);
  }
  EXPECT_GT(negative, 96);
  EXPECT_LT(negative, 160);
  EXPECT_GT(differ, 96);
  // Bit c: column c's sign is -1 (values from an independent implementation of the hash).
  for (const auto& [seed, pinned] : {std::pair<std::uint64_t, std::uint32_t>{0, 0x737afa89u}, {42, 0xfcd872a1u}}) {
    std::uint32_t first32 = 0;
    for (int c = 0; c < 32; ++c) first32 |= static_cast<std::uint32_t>(fp8::hadamard_sign(seed, c)) << c;
    EXPECT_EQ(first32, pinned) << "seed " << seed;
  }
  std::vector<float> a = normals(128, 5), b = a;
  reference::hadamard_rotate(a.data(), 128, 7);
  reference::hadamard_rotate(b.data(), 128, 7);
  EXPECT_EQ(a, b);
  std::vector<float> c = normals(128, 5);
  reference::hadamard_rotate(c.data(), 128, 8);
  EXPECT_NE(a, c);
}

struct Quantized {
  HostTensor input, output, scale;
  fp8::QuantizeArgs args;
};

Quantized make(DType dtype, std::int64_t batch, std::int64_t seqlen, std::int64_t heads, std::int64_t d, int block_rows,
               bool hadamard, std::uint64_t seed = 3) {
  Quantized q;
  q.input = HostTensor(dtype, {batch, seqlen, heads, d}, strided_layout());
  q.output = HostTensor(DType::kFloat8E4M3, {batch, seqlen, heads, d});
  q.scale = HostTensor(DType::kFloat32, {batch, heads, (seqlen + block_rows - 1) / block_rows});
  std::mt19937_64 rng(seed);
  q.input.fill_normal(rng);
  q.args.input = q.input.view();
  q.args.output = q.output.view();
  q.args.scale = q.scale.view();
  q.args.block_rows = block_rows;
  q.args.hadamard = hadamard;
  q.args.seed = seed;
  return q;
}

// Each block's scale is its absmax / 448, its largest element becomes +-448, and every
// code is the e4m3 rounding of the (transformed) value over the scale.
TEST(Fp8Quantize, FollowsTheDefinition) {
  for (const bool hadamard : {false, true}) {
    Quantized q = make(DType::kBFloat16, 2, 200, 3, 96, 64, hadamard);
    q.input.set({1, 130, 2, 5}, 30.f);  // an outlier in one block
    ASSERT_TRUE(cpu::quantize(q.args).is_ok());
    for (std::int64_t b = 0; b < 2; ++b) {
      for (std::int64_t h = 0; h < 3; ++h) {
        for (std::int64_t blk = 0; blk < 4; ++blk) {
          std::vector<std::vector<float>> rows;
          float absmax = 0.f;
          for (std::int64_t s = blk * 64; s < std::min<std::int64_t>(200, blk * 64 + 64); ++s) {
            std::vector<float> row(96);
            for (int c = 0; c < 96; ++c) row[static_cast<std::size_t>(c)] = q.input.get({b, s, h, c});
            if (hadamard) reference::hadamard_rotate(row.data(), 96, q.args.seed);
            for (float x : row) absmax = std::max(absmax, std::fabs(x));
            rows.push_back(row);
          }
          const float scale = q.scale.get({b, h, blk, 0});
          ASSERT_EQ(scale, absmax / 448.f);
          int at_max = 0;
          for (std::size_t r = 0; r < rows.size(); ++r) {
            for (int c = 0; c < 96; ++c) {
              const float code = q.output.get({b, blk * 64 + static_cast<std::int64_t>(r), h, c});
              ASSERT_EQ(code, numeric::round_to_e4m3(rows[r][static_cast<std::size_t>(c)] * (448.f / absmax)));
              at_max += std::fabs(code) == 448.f;
            }
          }
          EXPECT_GE(at_max, 1);
        }
      }
    }
  }
}

TEST(Fp8Quantize, ZeroBlockHasScaleOne) {
  Quantized q = make(DType::kFloat32, 1, 10, 1, 64, 8, true);
  for (std::int64_t s = 8; s < 10; ++s) {
    for (int c = 0; c < 64; ++c) q.input.set({0, s, 0, c}, 0.f);
  }
  ASSERT_TRUE(cpu::quantize(q.args).is_ok());
  EXPECT_EQ(q.scale.get({0, 0, 1, 0}), 1.f);
  for (int c = 0; c < 64; ++c) EXPECT_EQ(q.output.get({0, 9, 0, c}), 0.f);
}

// The transform spreads an outlier: one entry of 100 in a block of normals sets the
// block's scale without the transform, and about 100 / sqrt(128) of it with.
TEST(Fp8Quantize, HadamardSpreadsOutliers) {
  float scale[2];
  for (const bool hadamard : {false, true}) {
    Quantized q = make(DType::kFloat32, 1, 128, 1, 128, 128, hadamard, 21);
    q.input.set({0, 0, 0, 17}, 100.f);
    ASSERT_TRUE(cpu::quantize(q.args).is_ok());
    scale[hadamard] = q.scale.get({0, 0, 0, 0});
  }
  EXPECT_EQ(scale[0], 100.f / 448.f);
  EXPECT_LT(scale[1] * 4, scale[0]);
}

struct QuantizeRule {
  const char* name;
  void (*breaks)(fp8::QuantizeArgs&);
  StatusCode code;
  const char* message;
};

TEST(Fp8Quantize, EachRuleIsRefusedAndNothingWritten) {
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  const QuantizeRule rules[] = {
      {"input null", [](fp8::QuantizeArgs& a) { a.input.data = nullptr; }, kInvalid, "input: data pointer is null"},
      {"input rank 3", [](fp8::QuantizeArgs& a) { a.input.rank = 3; }, kInvalid,
       "input: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank 3"},
      {"input dim 0", [](fp8::QuantizeArgs& a) { a.input.shape[1] = 0; }, kInvalid, "input: dim 1 must be >= 1, got 0"},
      {"input stride negative", [](fp8::QuantizeArgs& a) { a.input.stride[0] = -1; }, kInvalid,
       "input: stride of dim 0 must be >= 0, got -1"},
      {"output last dim strided", [](fp8::QuantizeArgs& a) { a.output.stride[3] = 2; }, kInvalid,
       "output: last dimension must be contiguous (stride 1), got stride 2"},
      {"input e4m3", [](fp8::QuantizeArgs& a) { a.input.dtype = DType::kFloat8E4M3; }, kInvalid,
       "input: dtype must be fp32, fp16 or bf16, got e4m3"},
      {"output bf16", [](fp8::QuantizeArgs& a) { a.output.dtype = DType::kBFloat16; }, kInvalid,
       "output: dtype must be e4m3, got bf16"},
      {"output shape", [](fp8::QuantizeArgs& a) { a.output.shape[2] = 1; }, kInvalid,
       "output: shape (2, 70, 1, 64) must equal input's shape (2, 70, 3, 64)"},
      {"block_rows 0", [](fp8::QuantizeArgs& a) { a.block_rows = 0; }, kInvalid, "block_rows must be >= 1, got 0"},
      {"scale null", [](fp8::QuantizeArgs& a) { a.scale.data = nullptr; }, kInvalid, "scale: data pointer is null"},
      {"scale rank 2", [](fp8::QuantizeArgs& a) { a.scale.rank = 2; }, kInvalid,
       "scale: expected a 3-d tensor (batch, nheads, blocks), got rank 2"},
      {"scale bf16", [](fp8::QuantizeArgs& a) { a.scale.dtype = DType::kBFloat16; }, kInvalid,
       "scale: dtype must be fp32, got bf16"},
      {"scale blocks", [](fp8::QuantizeArgs& a) { a.block_rows = 64; }, kInvalid,
       "scale: shape (2, 3, 3) must be (batch, nheads, ceil(seqlen / block_rows)) = (2, 3, 2)"},
      {"scale stride negative", [](fp8::QuantizeArgs& a) { a.scale.stride[2] = -1; }, kInvalid,
       "scale: stride of dim 2 must be >= 0, got -1"},
      {"head dim 264", [](fp8::QuantizeArgs& a) { a.input.shape[3] = a.output.shape[3] = 264; },
       StatusCode::kNotSupported, "input: head dim 264 is not supported; supported: 1 to 256"},
      {"hadamard head dim 48", [](fp8::QuantizeArgs& a) { a.input.shape[3] = a.output.shape[3] = 48; }, kInvalid,
       "input: head dim 48 is not a multiple of 32, as the Hadamard transform needs (hadamard=false quantizes it)"},
      {"input misaligned", [](fp8::QuantizeArgs& a) { a.input.data = static_cast<char*>(a.input.data) + 1; },
       kInvalid, "input: data pointer is not aligned to its element size"},
  };
  for (const QuantizeRule& rule : rules) {
    SCOPED_TRACE(rule.name);
    Quantized q = make(DType::kBFloat16, 2, 70, 3, 64, 32, true);
    q.output.fill_nan();
    q.scale.fill_nan();
    ASSERT_TRUE(cpu::quantize(q.args).is_ok());
    q.output.fill_nan();
    q.scale.fill_nan();
    rule.breaks(q.args);
    const Status s = cpu::quantize(q.args);
    EXPECT_EQ(s.code(), rule.code);
    EXPECT_EQ(s.message(), rule.message);
    q.output.for_each([&](const Index& i, std::int64_t) { ASSERT_TRUE(std::isnan(q.output.get(i))); });
    q.scale.for_each([&](const Index& i, std::int64_t) { ASSERT_TRUE(std::isnan(q.scale.get(i))); });
  }
}

// A varlen batch: lengths 70, 0, 1, 129 and 5 packed in 208 rows (3 of no sequence),
// blocks of 32 rows; its scales (5, 3, ceil(129 / 32)).
struct PackedQuantized {
  std::vector<std::int32_t> lens = {70, 0, 1, 129, 5};
  std::vector<std::int32_t> cu = {0};
  HostTensor input, output, scale;
  fp8::QuantizeArgs args;

  explicit PackedQuantized(bool hadamard) {
    for (std::int32_t n : lens) cu.push_back(cu.back() + n);
    const std::int64_t total = cu.back() + 3;
    input = HostTensor(DType::kBFloat16, {total, 3, 64});
    output = HostTensor(DType::kFloat8E4M3, {total, 3, 64});
    scale = HostTensor(DType::kFloat32, {5, 3, 5});
    std::mt19937_64 rng(9);
    input.fill_normal(rng);
    args.input = input.view();
    args.output = output.view();
    args.scale = scale.view();
    args.block_rows = 32;
    args.hadamard = hadamard;
    args.seed = 4;
    args.cu_seqlens = TensorView::contiguous(cu.data(), DType::kInt32, {6});
    args.max_seqlen = 129;
  }
};

// Each sequence gives the codes and scales it gives quantized alone, bit for bit; its
// blocks past its rows get scale 1; rows of no sequence are not written.
TEST(Fp8QuantizeVarlen, EachSequenceIsQuantizedAlone) {
  for (const bool hadamard : {false, true}) {
    SCOPED_TRACE(hadamard ? "hadamard" : "plain");
    PackedQuantized packed(hadamard);
    const Status st = cpu::quantize(packed.args);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (std::int64_t b = 0; b < 5; ++b) {
      const std::int64_t first = packed.cu[b], rows = packed.lens[b];
      const std::int64_t own_blocks = (rows + 31) / 32;
      for (std::int64_t h = 0; h < 3; ++h) {
        for (std::int64_t blk = own_blocks; blk < 5; ++blk) ASSERT_EQ(packed.scale.get({b, h, blk, 0}), 1.f);
      }
      if (rows == 0) continue;
      Quantized alone = make(DType::kBFloat16, 1, rows, 3, 64, 32, hadamard, 4);
      alone.input.for_each([&](const Index& i, std::int64_t) {
        alone.input.set(i, packed.input.get({first + i[1], i[2], i[3], 0}));
      });
      ASSERT_TRUE(cpu::quantize(alone.args).is_ok());
      alone.output.for_each([&](const Index& i, std::int64_t) {
        ASSERT_EQ(packed.output.get({first + i[1], i[2], i[3], 0}), alone.output.get(i)) << "sequence " << b;
      });
      alone.scale.for_each([&](const Index& i, std::int64_t) {
        ASSERT_EQ(packed.scale.get({b, i[1], i[2], 0}), alone.scale.get(i)) << "sequence " << b;
      });
    }
    for (std::int64_t r = packed.cu.back(); r < packed.cu.back() + 3; ++r) {
      for (std::int64_t h = 0; h < 3; ++h) ASSERT_TRUE(std::isnan(packed.output.get({r, h, 0, 0}))) << "row " << r;
    }
  }
}

TEST(Fp8QuantizeVarlen, EachRuleIsRefusedAndNothingWritten) {
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  const QuantizeRule rules[] = {
      {"input rank 4", [](fp8::QuantizeArgs& a) { a.input.rank = 4; }, kInvalid,
       "input: expected a 3-d tensor (total, nheads, head_dim), got rank 4"},
      {"cu_seqlens fp32", [](fp8::QuantizeArgs& a) { a.cu_seqlens.dtype = DType::kFloat32; }, kInvalid,
       "cu_seqlens: dtype must be int32, got fp32"},
      {"cu_seqlens one entry", [](fp8::QuantizeArgs& a) { a.cu_seqlens.shape[0] = 1; }, kInvalid,
       "cu_seqlens: shape (1) must be (batch + 1) with batch >= 1"},
      {"cu_seqlens from 1", [](fp8::QuantizeArgs& a) { static_cast<std::int32_t*>(a.cu_seqlens.data)[0] = 1; },
       kInvalid, "cu_seqlens: cu_seqlens[0] must be 0, got 1"},
      {"cu_seqlens past total", [](fp8::QuantizeArgs& a) { static_cast<std::int32_t*>(a.cu_seqlens.data)[5] = 300; },
       kInvalid, "cu_seqlens: cu_seqlens[5] = 300 exceeds input's total rows, 208"},
      {"max_seqlen short", [](fp8::QuantizeArgs& a) { a.max_seqlen = 128; }, kInvalid,
       "max_seqlen: 128 is less than the longest sequence, 129 (sequence 3)"},
      {"max_seqlen negative", [](fp8::QuantizeArgs& a) { a.max_seqlen = -1; }, kInvalid,
       "max_seqlen must be >= 0, got -1"},
      {"scale of seqlen", [](fp8::QuantizeArgs& a) { a.scale.shape[2] = 7; }, kInvalid,
       "scale: shape (5, 3, 7) must be (batch, nheads, ceil(max_seqlen / block_rows)) = (5, 3, 5)"},
      {"cu_seqlens missing", [](fp8::QuantizeArgs& a) { a.cu_seqlens = TensorView{}; }, kInvalid,
       "input: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank 3"},
  };
  for (const QuantizeRule& rule : rules) {
    SCOPED_TRACE(rule.name);
    PackedQuantized q(true);
    q.output.fill_nan();
    q.scale.fill_nan();
    rule.breaks(q.args);
    const Status s = cpu::quantize(q.args);
    EXPECT_EQ(s.code(), rule.code);
    EXPECT_EQ(s.message(), rule.message);
    q.output.for_each([&](const Index& i, std::int64_t) { ASSERT_TRUE(std::isnan(q.output.get(i))); });
    q.scale.for_each([&](const Index& i, std::int64_t) { ASSERT_TRUE(std::isnan(q.scale.get(i))); });
  }
  // A fixed-length call leaves max_seqlen 0.
  Quantized fixed = make(DType::kBFloat16, 2, 70, 3, 64, 32, true);
  fixed.args.max_seqlen = 70;
  const Status s = cpu::quantize(fixed.args);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_EQ(s.message(), "max_seqlen: 70 given without cu_seqlens (it belongs to a varlen call)");
}

}  // namespace
}  // namespace fa3::testing
