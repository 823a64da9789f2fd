// Varlen calls with e4m3 inputs on the CPU path: each sequence equals a fixed-length
// FP8 call on copies of its rows with its own row of every scale tensor, bit for bit
// (the descales' (batch, nheads_kv) and the block scales' blocks counted from the
// sequence's first row); rows of no sequence, NaN codes in them included, get out 0
// and lse -inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fa3/cpu.h"
#include "host_tensor.h"
#include "varlen_case.h"

namespace fa3::testing {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kBlockRows = 16;

struct Fp8VarlenCase {
  std::string name;
  std::vector<std::int32_t> q_lens, k_lens, q_used, k_used;
  bool causal = false;
  bool block_scales = true;
  std::int64_t nheads_q = 4, nheads_kv = 2, head_dim = 32;

  std::int64_t batch() const { return static_cast<std::int64_t>(q_lens.size()); }
  std::int64_t used_q(std::int64_t b) const { return (q_used.empty() ? q_lens : q_used)[static_cast<std::size_t>(b)]; }
  std::int64_t used_k(std::int64_t b) const { return (k_used.empty() ? k_lens : k_used)[static_cast<std::size_t>(b)]; }
};

void PrintTo(const Fp8VarlenCase& c, std::ostream* os) { *os << c.name; }

std::int64_t blocks(std::int64_t rows) { return (rows + kBlockRows - 1) / kBlockRows; }

// Packed e4m3 q, k, v (NaN codes in the rows of no sequence, three past the last), bf16
// out, the scales of every sequence, and the index tensors.
struct Fp8Varlen {
  Fp8VarlenCase c;
  HostTensor q, k, v, out, lse;
  HostTensor q_descale, k_descale, v_descale, q_blocks, k_blocks, v_blocks;
  std::vector<std::int32_t> cu_q, cu_k, used_q, used_k;
  int max_q = 0, max_k = 0;

  static TensorView index(std::vector<std::int32_t>& values) {
    if (values.empty()) return {};
    return TensorView::contiguous(values.data(), DType::kInt32, {static_cast<std::int64_t>(values.size())});
  }

  ForwardArgs args() {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.options.causal = c.causal;
    a.varlen.cu_seqlens_q = index(cu_q);
    a.varlen.cu_seqlens_k = index(cu_k);
    a.varlen.seqused_q = index(used_q);
    a.varlen.seqused_k = index(used_k);
    a.varlen.max_seqlen_q = max_q;
    a.varlen.max_seqlen_k = max_k;
    a.fp8.q_descale = q_descale.view();
    a.fp8.k_descale = k_descale.view();
    a.fp8.v_descale = v_descale.view();
    if (c.block_scales) {
      a.fp8.q_block_scale = q_blocks.view();
      a.fp8.k_block_scale = k_blocks.view();
      a.fp8.v_block_scale = v_blocks.view();
      a.fp8.block_rows = kBlockRows;
    }
    return a;
  }

  bool q_row_used(std::int64_t row) const {
    return VarlenAttention::row_used(cu_q, row, [&](std::int64_t b) { return c.used_q(b); });
  }
  bool k_row_used(std::int64_t row) const {
    return VarlenAttention::row_used(cu_k, row, [&](std::int64_t b) { return c.used_k(b); });
  }
};

void fill_scales(std::mt19937_64& rng, HostTensor& t) {
  std::uniform_real_distribution<float> scale(0.25f, 1.75f);
  t.for_each([&](const Index& i, std::int64_t) { t.set(i, scale(rng)); });
}

Fp8Varlen make_case(const Fp8VarlenCase& c, std::uint64_t seed) {
  Fp8Varlen a;
  a.c = c;
  a.cu_q = offsets(c.q_lens);
  a.cu_k = offsets(c.k_lens);
  a.used_q = c.q_used;
  a.used_k = c.k_used;
  for (std::int64_t b = 0; b < c.batch(); ++b) {
    a.max_q = std::max(a.max_q, static_cast<int>(c.used_q(b)));
    a.max_k = std::max(a.max_k, static_cast<int>(c.used_k(b)));
  }
  const std::int64_t total_q = a.cu_q.back() + 3, total_k = a.cu_k.back() + 3;
  a.q = HostTensor(DType::kFloat8E4M3, {total_q, c.nheads_q, c.head_dim});
  a.k = HostTensor(DType::kFloat8E4M3, {total_k, c.nheads_kv, c.head_dim});
  a.v = HostTensor(DType::kFloat8E4M3, {total_k, c.nheads_kv, c.head_dim});
  a.out = HostTensor(DType::kBFloat16, {total_q, c.nheads_q, c.head_dim});
  a.lse = HostTensor(DType::kFloat32, {c.nheads_q, total_q});
  for (HostTensor* t : {&a.q_descale, &a.k_descale, &a.v_descale}) {
    *t = HostTensor(DType::kFloat32, {c.batch(), c.nheads_kv});
  }
  a.q_blocks = HostTensor(DType::kFloat32, {c.batch(), c.nheads_q, blocks(a.max_q)});
  a.k_blocks = HostTensor(DType::kFloat32, {c.batch(), c.nheads_kv, blocks(a.max_k)});
  a.v_blocks = HostTensor(DType::kFloat32, {c.batch(), c.nheads_kv, blocks(a.max_k)});
  std::mt19937_64 rng(seed);
  for (HostTensor* t : {&a.q, &a.k, &a.v}) t->fill_normal(rng);
  for (HostTensor* t : {&a.q_descale, &a.k_descale, &a.v_descale, &a.q_blocks, &a.k_blocks, &a.v_blocks}) {
    fill_scales(rng, *t);
  }
  poison_unused_rows(a.q, [&](std::int64_t r) { return a.q_row_used(r); });
  poison_unused_rows(a.k, [&](std::int64_t r) { return a.k_row_used(r); });
  poison_unused_rows(a.v, [&](std::int64_t r) { return a.k_row_used(r); });
  return a;
}

// Row b of a (batch, heads) descale as a tensor of batch 1.
HostTensor descale_row(const HostTensor& t, std::int64_t b, std::int64_t heads) {
  HostTensor row(DType::kFloat32, {1, heads});
  row.for_each([&](const Index& i, std::int64_t) { row.set(i, t.get({b, i[1], 0, 0})); });
  return row;
}

// Entry b of (batch, heads, blocks) block scales, its first `count` blocks (a sequence's
// own), as a tensor of batch 1.
HostTensor blocks_row(const HostTensor& t, std::int64_t b, std::int64_t heads, std::int64_t count) {
  HostTensor row(DType::kFloat32, {1, heads, count});
  row.for_each([&](const Index& i, std::int64_t) { row.set(i, t.get({b, i[1], i[2], 0})); });
  return row;
}

std::vector<Fp8VarlenCase> cases() {
  Fp8VarlenCase mixed;
  mixed.q_lens = {1, 17, 0, 70, 5, 3};
  mixed.k_lens = {1, 33, 4, 129, 0, 2};
  std::vector<Fp8VarlenCase> all;
  Fp8VarlenCase plain = mixed;
  plain.name = "block_scales";
  all.push_back(plain);
  Fp8VarlenCase causal = mixed;
  causal.causal = true;
  causal.q_used = {1, 10, 0, 65, 5, 0};
  causal.k_used = {1, 30, 2, 129, 0, 2};
  causal.name = "causal_seqused_block_scales";
  all.push_back(causal);
  Fp8VarlenCase descales = mixed;
  descales.block_scales = false;
  descales.nheads_kv = 1;
  descales.name = "descales_mqa";
  all.push_back(descales);
  return all;
}

class Fp8VarlenForward : public ::testing::TestWithParam<Fp8VarlenCase> {};

TEST_P(Fp8VarlenForward, EqualsEachSequenceAlone) {
  const Fp8VarlenCase& c = GetParam();
  Fp8Varlen a = make_case(c, 77);
  const Status st = cpu::forward(a.args());
  ASSERT_TRUE(st.is_ok()) << st.to_string();

  const std::int64_t total_q = a.q.view().shape[0];
  std::vector<bool> checked(static_cast<std::size_t>(total_q), false);
  for (std::int64_t b = 0; b < c.batch(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const std::int64_t q0 = a.cu_q[static_cast<std::size_t>(b)], k0 = a.cu_k[static_cast<std::size_t>(b)];
    const std::int64_t sq = c.used_q(b), sk = c.used_k(b);
    if (sq == 0 || sk == 0) continue;  // zeros and -inf, checked below
    for (std::int64_t i = 0; i < sq; ++i) checked[static_cast<std::size_t>(q0 + i)] = true;
    HostTensor q = cut_rows(a.q, q0, sq), k = cut_rows(a.k, k0, sk), v = cut_rows(a.v, k0, sk);
    HostTensor out(DType::kBFloat16, {1, sq, c.nheads_q, c.head_dim});
    HostTensor lse(DType::kFloat32, {1, c.nheads_q, sq});
    HostTensor q_descale = descale_row(a.q_descale, b, c.nheads_kv),
               k_descale = descale_row(a.k_descale, b, c.nheads_kv),
               v_descale = descale_row(a.v_descale, b, c.nheads_kv);
    HostTensor q_blocks = blocks_row(a.q_blocks, b, c.nheads_q, blocks(sq)),
               k_blocks = blocks_row(a.k_blocks, b, c.nheads_kv, blocks(sk)),
               v_blocks = blocks_row(a.v_blocks, b, c.nheads_kv, blocks(sk));
    ForwardArgs alone;
    alone.q = q.view();
    alone.k = k.view();
    alone.v = v.view();
    alone.out = out.view();
    alone.lse = lse.view();
    alone.options.causal = c.causal;
    alone.fp8.q_descale = q_descale.view();
    alone.fp8.k_descale = k_descale.view();
    alone.fp8.v_descale = v_descale.view();
    if (c.block_scales) {
      alone.fp8.q_block_scale = q_blocks.view();
      alone.fp8.k_block_scale = k_blocks.view();
      alone.fp8.v_block_scale = v_blocks.view();
      alone.fp8.block_rows = kBlockRows;
    }
    const Status fixed = cpu::forward(alone);
    ASSERT_TRUE(fixed.is_ok()) << fixed.to_string();
    out.for_each([&](const Index& i, std::int64_t) { ASSERT_EQ(a.out.get({q0 + i[1], i[2], i[3], 0}), out.get(i)); });
    lse.for_each([&](const Index& i, std::int64_t) { ASSERT_EQ(a.lse.get({i[1], q0 + i[2], 0, 0}), lse.get(i)); });
  }
  for (std::int64_t row = 0; row < total_q; ++row) {
    if (checked[static_cast<std::size_t>(row)]) continue;
    for (std::int64_t h = 0; h < c.nheads_q; ++h) {
      for (std::int64_t d = 0; d < c.head_dim; ++d) ASSERT_EQ(a.out.get({row, h, d, 0}), 0.f) << row;
      ASSERT_EQ(a.lse.get({h, row, 0, 0}), kNegInf) << row;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8Varlen, Fp8VarlenForward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// A sequence's scales are its own: doubling sequence 1's v_descale doubles its rows of
// out (a power of two: exact) and leaves every other sequence's bitwise as they were.
TEST(Fp8VarlenScales, ASequenceReadsItsOwnRow) {
  Fp8VarlenCase c = cases().front();
  Fp8Varlen a = make_case(c, 78);
  ASSERT_TRUE(cpu::forward(a.args()).is_ok());
  const HostTensor before = a.out;
  for (std::int64_t h = 0; h < c.nheads_kv; ++h) a.v_descale.set({1, h, 0, 0}, 2.f * a.v_descale.get({1, h, 0, 0}));
  ASSERT_TRUE(cpu::forward(a.args()).is_ok());
  const std::int64_t first = a.cu_q[1], end = a.cu_q[2];
  a.out.for_each([&](const Index& i, std::int64_t) {
    const bool in_1 = i[0] >= first && i[0] < end;
    ASSERT_EQ(a.out.get(i), (in_1 ? 2.f : 1.f) * before.get(i)) << "row " << i[0];
  });
}

}  // namespace
}  // namespace fa3::testing
