// The sampled gradient check of `fa3 run --backward`: its exact gradients of chosen
// rows equal the library's full reference (every mask, GQA, softcap, sinks, strided
// views), and the check fails on a wrong element or a NaN anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "api/validate.h"
#include "common/numeric.h"
#include "grad_check.h"
#include "grad_reference.h"
#include "reference/naive.h"
#include "row_check.h"

namespace fa3::test {
namespace {

using reference::RowRef;

struct Case {
  std::string name;
  std::int64_t batch, seqlen_q, seqlen_k, nheads_q, nheads_kv, head_dim;
  AttentionOptions options;
  bool strided = false;      // q, k, v, dout stored (batch, head, seqlen, dim), viewed as fa3's layout
  std::vector<float> sinks;  // one per query head; empty: none
  std::int64_t head_dim_v = 0;  // of v, out, dout and dv; 0: head_dim

  std::int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

AttentionOptions causal() {
  AttentionOptions o;
  o.causal = true;
  return o;
}

AttentionOptions window_softcap() {
  AttentionOptions o;
  o.window_left = 5;
  o.window_right = 2;
  o.softcap = 4.f;
  o.softmax_scale = 0.4f;
  return o;
}

// Buffers of one problem in a given dtype, with views in fa3's layout.
class Tensors {
 public:
  Tensors(const Case& c, DType dtype) : c_(c), dtype_(dtype) {
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal;
    const std::int64_t q_elems = c.batch * c.seqlen_q * c.nheads_q * c.head_dim;
    const std::int64_t kv_elems = c.batch * c.seqlen_k * c.nheads_kv * c.head_dim;
    const std::int64_t out_elems = c.batch * c.seqlen_q * c.nheads_q * c.value_dim();
    const std::int64_t v_elems = c.batch * c.seqlen_k * c.nheads_kv * c.value_dim();
    using Buffer = std::pair<std::vector<std::byte>*, std::int64_t>;
    for (auto [buf, n] :
         {Buffer{&q_, q_elems}, Buffer{&k_, kv_elems}, Buffer{&v_, v_elems}, Buffer{&dout_, out_elems}}) {
      buf->resize(static_cast<std::size_t>(n) * 4);
      for (std::int64_t i = 0; i < n; ++i) numeric::store_from_float(buf->data(), i, dtype, normal(rng));
    }
    out_.resize(static_cast<std::size_t>(out_elems) * 4);
    dq_.resize(static_cast<std::size_t>(q_elems) * 4);
    dk_.resize(static_cast<std::size_t>(kv_elems) * 4);
    dv_.resize(static_cast<std::size_t>(v_elems) * 4);
    lse_.assign(static_cast<std::size_t>(c.batch * c.nheads_q * c.seqlen_q), 0.f);
    sinks_ = c.sinks;
  }

  BackwardArgs args() {
    BackwardArgs a;
    const std::int64_t d = c_.head_dim, dv = c_.value_dim();
    a.q = input(q_.data(), c_.seqlen_q, c_.nheads_q, d);
    a.k = input(k_.data(), c_.seqlen_k, c_.nheads_kv, d);
    a.v = input(v_.data(), c_.seqlen_k, c_.nheads_kv, dv);
    a.dout = input(dout_.data(), c_.seqlen_q, c_.nheads_q, dv);
    a.out = TensorView::contiguous(out_.data(), dtype_, {c_.batch, c_.seqlen_q, c_.nheads_q, dv});
    a.dq = TensorView::contiguous(dq_.data(), dtype_, {c_.batch, c_.seqlen_q, c_.nheads_q, d});
    a.dk = TensorView::contiguous(dk_.data(), dtype_, {c_.batch, c_.seqlen_k, c_.nheads_kv, d});
    a.dv = TensorView::contiguous(dv_.data(), dtype_, {c_.batch, c_.seqlen_k, c_.nheads_kv, dv});
    a.lse = TensorView::contiguous(lse_.data(), DType::kFloat32, {c_.batch, c_.nheads_q, c_.seqlen_q});
    if (!sinks_.empty()) a.sinks = TensorView::contiguous(sinks_.data(), DType::kFloat32, {c_.nheads_q});
    a.options = c_.options;
    return a;
  }

 private:
  TensorView input(void* data, std::int64_t seqlen, std::int64_t heads, std::int64_t d) const {
    if (!c_.strided) return TensorView::contiguous(data, dtype_, {c_.batch, seqlen, heads, d});
    return TensorView::strided(data, dtype_, {c_.batch, seqlen, heads, d}, {heads * seqlen * d, d, seqlen * d, 1});
  }

  Case c_;
  DType dtype_;
  std::vector<std::byte> q_, k_, v_, dout_, out_, dq_, dk_, dv_;
  std::vector<float> lse_, sinks_;
};

Problem problem_of(const BackwardArgs& a) {
  Problem p;
  const Status s = validate_backward(a, cpu_target(), &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return p;
}

std::vector<RowRef> all_rows(std::int64_t batch, std::int64_t heads, std::int64_t rows) {
  std::vector<RowRef> all;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t r = 0; r < rows; ++r) all.push_back({b, h, r});
    }
  }
  return all;
}

class SampledReference : public ::testing::TestWithParam<Case> {};

// Every row sampled: the result is the full reference, whatever the thread count.
TEST_P(SampledReference, EqualsTheFullReference) {
  const Case& c = GetParam();
  Tensors t(c, DType::kFloat32);
  const BackwardArgs a = t.args();
  const Problem p = problem_of(a);
  const reference::BackwardResult full =
      reference::backward(p, a.q, a.k, a.v, a.dout, reference::Precision::kExact, a.sinks);
  const std::vector<RowRef> query_rows = all_rows(c.batch, c.nheads_q, c.seqlen_q);
  const std::vector<RowRef> key_rows = all_rows(c.batch, c.nheads_kv, c.seqlen_k);
  for (int threads : {1, 3}) {
    const cli::GradientRows g = cli::reference_gradients(p, a, query_rows, key_rows, threads);
    auto expect_equal = [&](const std::vector<double>& got, const std::vector<RowRef>& rows, std::int64_t seqlen,
                            std::int64_t heads, std::int64_t dim, const std::vector<double>& want, const char* name) {
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t r = 0; r < rows.size(); ++r) {
        // Canonical (batch, seqlen, heads, dim) offset of the row in the full result.
        const std::size_t at =
            static_cast<std::size_t>(((rows[r].batch * seqlen + rows[r].row) * heads + rows[r].head) * dim);
        for (std::int64_t d = 0; d < dim; ++d) {
          const double w = want[at + static_cast<std::size_t>(d)];
          ASSERT_NEAR(got[r * static_cast<std::size_t>(dim) + static_cast<std::size_t>(d)], w,
                      1e-10 * (1 + std::fabs(w)))
              << name << " row " << r << " dim " << d << ", " << threads << " threads";
        }
      }
    };
    expect_equal(g.dq, query_rows, c.seqlen_q, c.nheads_q, c.head_dim, full.dq, "dq");
    expect_equal(g.dk, key_rows, c.seqlen_k, c.nheads_kv, c.head_dim, full.dk, "dk");
    expect_equal(g.dv, key_rows, c.seqlen_k, c.nheads_kv, c.value_dim(), full.dv, "dv");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cli, SampledReference,
    ::testing::Values(
        Case{"mha", 1, 23, 23, 2, 2, 16, {}}, Case{"gqa_causal_more_keys", 2, 13, 29, 4, 2, 12, causal()},
        // The first 11 query rows see no key: zero dq, no share in dk/dv.
        Case{"mqa_causal_more_queries", 1, 19, 8, 3, 1, 10, causal()},
        Case{"window_softcap_scale", 1, 21, 17, 2, 1, 9, window_softcap()},
        Case{"strided", 2, 11, 14, 4, 2, 8, causal(), true},
        // Sinks in lse and D; the first 4 query rows keep only theirs.
        Case{"gqa_causal_sinks", 2, 13, 9, 4, 2, 12, causal(), false, {0.5f, -1.f, 2.f, 3.f}},
        // V head dims of their own, wider and narrower than q's.
        Case{"gqa_causal_wide_v", 2, 13, 29, 4, 2, 12, causal(), false, {}, 20},
        Case{"strided_narrow_v_sinks", 2, 11, 14, 4, 2, 16, window_softcap(), true, {1.f, 0.f, -1.f, 2.f}, 6}),
    [](const auto& info) { return info.param.name; });

// Gradients as a correct bf16 kernel leaves them: the exact ones, rounded.
class CheckGradients : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = t_.args();
    p_ = problem_of(a_);
    const reference::BackwardResult exact = reference::backward(p_, a_.q, a_.k, a_.v, a_.dout);
    using Result = std::pair<const TensorView*, const std::vector<double>*>;
    for (auto [view, values] : {Result{&a_.dq, &exact.dq}, Result{&a_.dk, &exact.dk}, Result{&a_.dv, &exact.dv}}) {
      for (std::size_t i = 0; i < values->size(); ++i) {
        numeric::store_from_float(view->data, static_cast<std::int64_t>(i), view->dtype,
                                  static_cast<float>((*values)[i]));
      }
    }
    query_rows_ = cli::sample_rows(p_, 6, 1);
    key_rows_ = cli::sample_key_rows(p_, 6, 1);
  }

  cli::GradientChecks check() const { return cli::check_gradients(p_, a_, query_rows_, key_rows_, 2); }

  // Element (b, s, h, d) of a contiguous (batch, seqlen, heads, dim) gradient.
  void set(const TensorView& t, const RowRef& row, std::int64_t d, float value) const {
    const std::int64_t index[TensorView::kMaxRank] = {row.batch, row.row, row.head, d};
    numeric::store_from_float(t.data, t.byte_offset(index) / static_cast<std::int64_t>(dtype_size(t.dtype)), t.dtype,
                              value);
  }

  Case case_{"check", 2, 37, 41, 4, 2, 16, causal()};
  Tensors t_{case_, DType::kBFloat16};
  BackwardArgs a_;
  Problem p_;
  std::vector<RowRef> query_rows_, key_rows_;
};

TEST_F(CheckGradients, PassesRoundedExactGradients) {
  const cli::GradientChecks c = check();
  EXPECT_TRUE(c.passed());
  EXPECT_EQ(c.dq.rows, 6);
  EXPECT_EQ(c.dk.rows, 6);
  EXPECT_GT(c.dv.max_reference, 0);
  EXPECT_GT(c.dq.max_error, 0) << "bf16 rounding leaves some error";
  EXPECT_LE(c.dq.max_error, c.dq.bound);
  EXPECT_DOUBLE_EQ(c.dk.bound, cli::gradient_bound(DType::kBFloat16, c.dk.max_reference));
}

TEST_F(CheckGradients, FailsOnAWrongElementOfASampledKeyRow) {
  const RowRef& row = key_rows_[2];
  const float was = cli::element(a_.dk, row.batch, row.row, row.head, 3);
  const double bound = check().dk.bound;
  set(a_.dk, row, 3, was + static_cast<float>(2 * bound));
  const cli::GradientChecks c = check();
  EXPECT_FALSE(c.passed());
  EXPECT_FALSE(c.dk.passed);
  EXPECT_GT(c.dk.max_error, c.dk.bound);
  EXPECT_TRUE(c.dq.passed && c.dv.passed);
}

TEST_F(CheckGradients, FailsOnANanOutsideTheSample) {
  RowRef unsampled{0, 0, 0};
  auto sampled = [&](const RowRef& r) {
    return std::any_of(query_rows_.begin(), query_rows_.end(),
                       [&](const RowRef& s) { return s.batch == r.batch && s.head == r.head && s.row == r.row; });
  };
  while (sampled(unsampled)) ++unsampled.row;
  set(a_.dq, unsampled, 0, NAN);
  const cli::GradientChecks c = check();
  EXPECT_FALSE(c.dq.passed);
  EXPECT_EQ(c.dq.nans, 1);
  EXPECT_TRUE(c.dk.passed && c.dv.passed);
}

TEST(SampleKeyRows, SpreadsOverBatchKvHeadsAndKeysEndingWithTheLast) {
  Problem p;
  p.batch = 3;
  p.nheads_q = 8;
  p.nheads_kv = 2;
  p.seqlen_q = 100;
  p.seqlen_k = 50;
  const std::vector<RowRef> rows = cli::sample_key_rows(p, 6, 0);
  ASSERT_EQ(rows.size(), 6u);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].batch, static_cast<std::int64_t>(i) / 2);
    EXPECT_EQ(rows[i].head, static_cast<std::int64_t>(i) % 2);
    EXPECT_LT(rows[i].row, 50);
  }
  EXPECT_EQ(rows.back().row, 49);
  EXPECT_EQ(cli::sample_key_rows(p, 1000, 0).size(), 300u) << "every key row of every KV head";
}

}  // namespace
}  // namespace fa3::test
