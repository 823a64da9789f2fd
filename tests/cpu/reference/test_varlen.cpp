// Variable-length (varlen) batches on the CPU paths: fa3::cpu::forward and backward on a
// varlen call equal each sequence run alone as a fixed-length call, bit for bit, with
// lengths 0 and 1, seqused, rows past the last sequence, and every mask option; the
// naive varlen reference agrees with the tiled path; rows of no sequence get out 0, lse
// -inf and zero gradients, whatever (NaN) they hold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "checks.h"
#include "fa3/cpu.h"
#include "host_tensor.h"
#include "reference/naive.h"
#include "reference/varlen.h"
#include "varlen_case.h"

namespace fa3::testing {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

Case base_case() {
  Case c;
  c.nheads_q = 4;
  c.nheads_kv = 2;
  c.head_dim = 32;
  c.dtype = DType::kBFloat16;
  return c;
}

// Lengths 1, 0, odd ones and ones past a 64-row tile; a query sequence whose keys are
// empty, and keys whose queries are; rows past the last sequence.
VarlenCase mixed() {
  VarlenCase v;
  v.q_lens = {1, 17, 0, 70, 5, 3};
  v.k_lens = {1, 33, 4, 129, 0, 2};
  v.extra_q = 3;
  v.extra_k = 2;
  v.base = base_case();
  return v;
}

std::vector<VarlenCase> cases() {
  std::vector<VarlenCase> all;
  VarlenCase plain = mixed();
  plain.name = "plain";
  all.push_back(plain);
  VarlenCase causal = mixed();
  causal.base.causal = true;
  causal.q_used = {1, 10, 0, 65, 5, 0};
  causal.k_used = {1, 30, 2, 129, 0, 2};
  causal.name = "causal_seqused";
  all.push_back(causal);
  VarlenCase window = mixed();
  window.base.window_left = 8;
  window.base.window_right = 3;
  window.base.softcap = 2.f;
  window.strided = true;
  window.name = "window_softcap_strided";
  all.push_back(window);
  VarlenCase chunk = mixed();
  chunk.base.causal = true;
  chunk.base.attention_chunk = 16;
  chunk.base.nheads_kv = 1;
  chunk.name = "chunk_mqa";
  all.push_back(chunk);
  VarlenCase sinks = mixed();
  sinks.base.sinks_stddev = 3.f;
  sinks.k_used = {1, 20, 4, 100, 0, 1};
  sinks.name = "sinks_seqused_k";
  all.push_back(sinks);
  VarlenCase wide_v = mixed();
  wide_v.base.head_dim_v = 48;
  wide_v.base.dtype = DType::kFloat16;
  wide_v.base.causal = true;
  wide_v.name = "head_dim_v_fp16";
  all.push_back(wide_v);
  return all;
}

class VarlenForward : public ::testing::TestWithParam<VarlenCase> {};

// Each sequence alone through fa3::cpu::forward (a fixed-length call on copies of its
// rows) gives exactly the rows the varlen call wrote; a sequence without keys, rows
// past seqused and rows past the last sequence hold out 0 and lse -inf (the sink's
// logit for a sequence without keys, with sinks).
TEST_P(VarlenForward, EqualsEachSequenceAlone) {
  const VarlenCase& c = GetParam();
  VarlenAttention a = make_varlen(c, 900);
  const Status st = cpu::forward(a.args());
  ASSERT_TRUE(st.is_ok()) << st.to_string();

  std::vector<bool> checked(static_cast<std::size_t>(a.problem.total_q), false);
  for (std::int64_t b = 0; b < c.batch(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const std::int64_t q0 = a.cu_q[static_cast<std::size_t>(b)], k0 = a.cu_k[static_cast<std::size_t>(b)];
    const std::int64_t sq = c.used_q(b), sk = c.used_k(b);
    for (std::int64_t i = 0; i < sq; ++i) checked[static_cast<std::size_t>(q0 + i)] = true;
    if (sq == 0) continue;
    if (sk == 0) {
      for (std::int64_t i = 0; i < sq; ++i) {
        for (std::int64_t h = 0; h < c.base.nheads_q; ++h) {
          const float sink = c.base.sinks_stddev > 0.f ? a.sinks.get({h, 0, 0, 0}) : kNegInf;
          for (std::int64_t d = 0; d < c.base.value_dim(); ++d) ASSERT_EQ(a.out.get({q0 + i, h, d, 0}), 0.f);
          ASSERT_FLOAT_EQ(a.lse.get({h, q0 + i, 0, 0}), sink);
        }
      }
      continue;
    }
    HostTensor q = cut_rows(a.q, q0, sq), k = cut_rows(a.k, k0, sk), v = cut_rows(a.v, k0, sk);
    HostTensor out(c.base.dtype, {1, sq, c.base.nheads_q, c.base.value_dim()});
    HostTensor lse(DType::kFloat32, {1, c.base.nheads_q, sq});
    ForwardArgs alone;
    alone.q = q.view();
    alone.k = k.view();
    alone.v = v.view();
    alone.out = out.view();
    alone.lse = lse.view();
    alone.sinks = a.sinks_view();
    alone.options = c.base.options();
    const Status fixed = cpu::forward(alone);
    ASSERT_TRUE(fixed.is_ok()) << fixed.to_string();
    out.for_each([&](const Index& i, std::int64_t) { ASSERT_EQ(a.out.get({q0 + i[1], i[2], i[3], 0}), out.get(i)); });
    lse.for_each([&](const Index& i, std::int64_t) { ASSERT_EQ(a.lse.get({i[1], q0 + i[2], 0, 0}), lse.get(i)); });
  }
  for (std::int64_t row = 0; row < a.problem.total_q; ++row) {
    if (checked[static_cast<std::size_t>(row)]) continue;
    for (std::int64_t h = 0; h < c.base.nheads_q; ++h) {
      for (std::int64_t d = 0; d < c.base.value_dim(); ++d) ASSERT_EQ(a.out.get({row, h, d, 0}), 0.f) << row;
      ASSERT_EQ(a.lse.get({h, row, 0, 0}), kNegInf) << row;
    }
  }
  EXPECT_TRUE(a.out.padding_is_nan()) << "out: written outside its view";
  EXPECT_TRUE(a.lse.padding_is_nan()) << "lse: written outside its view";
}

// The naive varlen reference (fp64) and the tiled path agree within the fp32 rule.
TEST_P(VarlenForward, TiledMatchesTheExactReference) {
  const VarlenCase& c = GetParam();
  VarlenAttention a = make_varlen(c, 901);
  ASSERT_TRUE(cpu::forward(a.args()).is_ok());
  const reference::ForwardResult ref = reference::varlen_forward(a.problem, a.args());
  double vmax = 0;
  a.v.for_each([&](const Index& i, std::int64_t) {
    if (!std::isnan(a.v.get(i))) vmax = std::max(vmax, std::fabs(static_cast<double>(a.v.get(i))));
  });
  expect_close("out", a.out, ref.out, kFp32OutTolerance * vmax, storage_rounding(c.base.dtype));
  expect_close("lse", a.lse, ref.lse, kFp32LseTolerance, kFp32LseTolerance);
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenForward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Gradient buffers of a varlen call: dout random in the used rows and NaN elsewhere.
struct VarlenGradients {
  HostTensor dout, dq, dk, dv, dsinks;

  explicit VarlenGradients(VarlenAttention& a) {
    const Case& b = a.c.base;
    const Layout rows = packed_layout(a.c.strided);
    dout = HostTensor(b.dtype, {a.problem.total_q, b.nheads_q, b.value_dim()}, rows);
    dq = HostTensor(b.dtype, {a.problem.total_q, b.nheads_q, b.head_dim}, rows);
    dk = HostTensor(b.dtype, {a.problem.total_k, b.nheads_kv, b.head_dim}, rows);
    dv = HostTensor(b.dtype, {a.problem.total_k, b.nheads_kv, b.value_dim()}, rows);
    dsinks = HostTensor(DType::kFloat32, {b.nheads_q});
    std::mt19937_64 rng(902);
    dout.fill_normal(rng);
    poison_unused_rows(dout, [&](std::int64_t r) { return a.q_row_used(r); });
  }

  BackwardArgs args(VarlenAttention& a) {
    BackwardArgs g;
    g.q = a.q.view();
    g.k = a.k.view();
    g.v = a.v.view();
    g.out = a.out.view();
    g.lse = a.lse.view();
    g.dout = dout.view();
    g.dq = dq.view();
    g.dk = dk.view();
    g.dv = dv.view();
    g.sinks = a.sinks_view();
    if (g.sinks.defined()) g.dsinks = dsinks.view();
    g.options = a.c.base.options();
    g.varlen = a.varlen();
    return g;
  }
};

// Rows [start, ...) of a packed gradient equal the fixed-length run's, bit for bit.
void expect_rows(const char* what, const HostTensor& got, std::int64_t start, const HostTensor& alone) {
  alone.for_each([&](const Index& i, std::int64_t) {
    ASSERT_EQ(got.get({start + i[1], i[2], i[3], 0}), alone.get(i)) << what << " row " << start + i[1];
  });
}

class VarlenBackward : public ::testing::TestWithParam<VarlenCase> {};

// Each sequence alone through fa3::cpu::backward gives exactly its rows of dq, dk and
// dv; rows of no sequence (and keys of a sequence without queries) get 0; dsinks is the
// sum of the sequences' (to fp32 rounding, since the sum's order differs).
TEST_P(VarlenBackward, EqualsEachSequenceAlone) {
  const VarlenCase& c = GetParam();
  VarlenAttention a = make_varlen(c, 903);
  ASSERT_TRUE(cpu::forward(a.args()).is_ok());
  VarlenGradients g(a);
  const Status st = cpu::backward(g.args(a));
  ASSERT_TRUE(st.is_ok()) << st.to_string();

  std::vector<bool> q_seen(static_cast<std::size_t>(a.problem.total_q)),
      k_seen(static_cast<std::size_t>(a.problem.total_k));
  std::vector<double> dsinks(static_cast<std::size_t>(c.base.nheads_q), 0.0);
  for (std::int64_t b = 0; b < c.batch(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const std::int64_t q0 = a.cu_q[static_cast<std::size_t>(b)], k0 = a.cu_k[static_cast<std::size_t>(b)];
    const std::int64_t sq = c.used_q(b), sk = c.used_k(b);
    if (sq == 0 || sk == 0) continue;  // no pair of rows meets: zero gradients, checked below
    for (std::int64_t i = 0; i < sq; ++i) q_seen[static_cast<std::size_t>(q0 + i)] = true;
    for (std::int64_t j = 0; j < sk; ++j) k_seen[static_cast<std::size_t>(k0 + j)] = true;
    HostTensor q = cut_rows(a.q, q0, sq), k = cut_rows(a.k, k0, sk), v = cut_rows(a.v, k0, sk);
    HostTensor out = cut_rows(a.out, q0, sq), dout = cut_rows(g.dout, q0, sq);
    HostTensor lse(DType::kFloat32, {1, c.base.nheads_q, sq});
    lse.for_each([&](const Index& i, std::int64_t) { lse.set(i, a.lse.get({i[1], q0 + i[2], 0, 0})); });
    HostTensor dq(c.base.dtype, {1, sq, c.base.nheads_q, c.base.head_dim});
    HostTensor dk(c.base.dtype, {1, sk, c.base.nheads_kv, c.base.head_dim});
    HostTensor dv(c.base.dtype, {1, sk, c.base.nheads_kv, c.base.value_dim()});
    HostTensor ds(DType::kFloat32, {c.base.nheads_q});
    BackwardArgs alone;
    alone.q = q.view();
    alone.k = k.view();
    alone.v = v.view();
    alone.out = out.view();
    alone.lse = lse.view();
    alone.dout = dout.view();
    alone.dq = dq.view();
    alone.dk = dk.view();
    alone.dv = dv.view();
    alone.sinks = a.sinks_view();
    if (alone.sinks.defined()) alone.dsinks = ds.view();
    alone.options = c.base.options();
    const Status fixed = cpu::backward(alone);
    ASSERT_TRUE(fixed.is_ok()) << fixed.to_string();
    expect_rows("dq", g.dq, q0, dq);
    expect_rows("dk", g.dk, k0, dk);
    expect_rows("dv", g.dv, k0, dv);
    if (alone.sinks.defined()) {
      for (std::int64_t h = 0; h < c.base.nheads_q; ++h) dsinks[static_cast<std::size_t>(h)] += ds.get({h, 0, 0, 0});
    }
  }
  auto expect_zero_elsewhere = [](const char* what, const HostTensor& t, const std::vector<bool>& seen) {
    t.for_each([&](const Index& i, std::int64_t) {
      if (!seen[static_cast<std::size_t>(i[0])]) ASSERT_EQ(t.get(i), 0.f) << what << " row " << i[0];
    });
  };
  expect_zero_elsewhere("dq", g.dq, q_seen);
  expect_zero_elsewhere("dk", g.dk, k_seen);
  expect_zero_elsewhere("dv", g.dv, k_seen);
  if (c.base.sinks_stddev > 0.f) {
    for (std::int64_t h = 0; h < c.base.nheads_q; ++h) {
      EXPECT_NEAR(g.dsinks.get({h, 0, 0, 0}), dsinks[static_cast<std::size_t>(h)],
                  1e-6 * (1 + std::fabs(dsinks[static_cast<std::size_t>(h)])));
    }
  }
  for (const HostTensor* t : {&g.dq, &g.dk, &g.dv}) EXPECT_TRUE(t->padding_is_nan()) << "written outside its view";
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenBackward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The sequences read from the index tensors, and the rows that belong to none: past
// seqused within a sequence, and past the last sequence.
TEST(VarlenSequences, ReadsOffsetsAndUsedRows) {
  VarlenCase c = mixed();
  c.q_used = {1, 10, 0, 65, 5, 0};
  VarlenAttention a = make_varlen(c, 904);
  const std::vector<reference::Sequence> seqs = reference::varlen_sequences(a.varlen());
  ASSERT_EQ(seqs.size(), 6u);
  EXPECT_EQ(seqs[1].q_start, 1);
  EXPECT_EQ(seqs[1].q_used, 10);
  EXPECT_EQ(seqs[1].q_end, 18);
  EXPECT_EQ(seqs[3].k_start, 38);
  EXPECT_EQ(seqs[3].k_used, 129);
  const std::vector<reference::RowRange> unused = reference::unused_query_rows(seqs, a.problem.total_q);
  const std::vector<std::pair<std::int64_t, std::int64_t>> want = {{11, 18}, {83, 88}, {93, 96}, {96, 99}};
  ASSERT_EQ(unused.size(), want.size());
  for (std::size_t n = 0; n < want.size(); ++n) {
    EXPECT_EQ(unused[n].begin, want[n].first) << n;
    EXPECT_EQ(unused[n].end, want[n].second) << n;
  }
  EXPECT_TRUE(reference::unused_key_rows(seqs, a.problem.total_k).size() == 1);
}

}  // namespace
}  // namespace fa3::testing
