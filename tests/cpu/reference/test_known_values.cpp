// Results known without running attention, checked against every CPU forward path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"
#include "forward_paths.h"
#include "host_tensor.h"

namespace fa3::testing {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Every path stores or accumulates in fp32 at worst; these cases have O(1) values
// and at most a few dozen terms per sum.
constexpr double kTolerance = 2e-6;

// The mask, restated from its definition in fa3/attention.h: the window, then the
// query's chunk (the keys j with floor(j / C) == floor(diag / C)).
std::int64_t chunk_of(std::int64_t pos, std::int64_t size) {
  return static_cast<std::int64_t>(std::floor(static_cast<double>(pos) / static_cast<double>(size)));
}
std::int64_t first_key(const Case& c, std::int64_t i) {
  const std::int64_t diag = i + c.seqlen_k - c.seqlen_q;
  std::int64_t first = c.window_left < 0 ? 0 : std::max<std::int64_t>(0, diag - c.window_left);
  if (c.attention_chunk > 0) first = std::max(first, chunk_of(diag, c.attention_chunk) * c.attention_chunk);
  return first;
}
std::int64_t last_key(const Case& c, std::int64_t i) {
  const std::int64_t diag = i + c.seqlen_k - c.seqlen_q;
  const int right = c.causal ? 0 : c.window_right;
  std::int64_t last = right < 0 ? c.seqlen_k - 1 : std::min<std::int64_t>(c.seqlen_k - 1, diag + right);
  if (c.attention_chunk > 0) {
    last = std::min(last, (chunk_of(diag, c.attention_chunk) + 1) * c.attention_chunk - 1);
  }
  return last;
}

std::int64_t out_at(const Case& c, std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) {
  return ((b * c.seqlen_q + i) * c.nheads_q + h) * c.value_dim() + d;
}
std::int64_t lse_at(const Case& c, std::int64_t b, std::int64_t h, std::int64_t i) {
  return (b * c.nheads_q + h) * c.seqlen_q + i;
}

// Runs every path on the case (outputs refilled with NaN before each) and hands
// the result to `check`.
template <typename Check>
void for_each_path(Attention& a, Check check) {
  for (const ForwardPath& path : forward_paths()) {
    SCOPED_TRACE(path.name);
    a.out.fill_nan();
    a.lse.fill_nan();
    check(path.run(a));
  }
}

// q = [1, 2]; keys [1, 0] and [0, 1]; values [1, 2] and [3, -1]: raw scores 1 and 2.
Attention two_keys(float scale, float softcap) {
  Case c;
  c.seqlen_k = 2;
  c.head_dim = 2;
  c.softmax_scale = scale;
  c.softcap = softcap;
  Attention a = make_attention(c, 1);
  a.q.set({0, 0, 0, 0}, 1.f);
  a.q.set({0, 0, 0, 1}, 2.f);
  a.k.set({0, 0, 0, 0}, 1.f);
  a.k.set({0, 0, 0, 1}, 0.f);
  a.k.set({0, 1, 0, 0}, 0.f);
  a.k.set({0, 1, 0, 1}, 1.f);
  a.v.set({0, 0, 0, 0}, 1.f);
  a.v.set({0, 0, 0, 1}, 2.f);
  a.v.set({0, 1, 0, 0}, 3.f);
  a.v.set({0, 1, 0, 1}, -1.f);
  return a;
}

// Gives `a` the sink logits `values`, one per query head.
void set_sinks(Attention& a, const std::vector<float>& values) {
  a.has_sinks = true;
  a.sinks = HostTensor(DType::kFloat32, {static_cast<std::int64_t>(values.size())});
  for (std::size_t h = 0; h < values.size(); ++h) a.sinks.set({static_cast<std::int64_t>(h)}, values[h]);
}

// The softmax of scores s0, s1 applied to the values above.
void expect_two_key_result(const reference::ForwardResult& r, double s0, double s1) {
  const double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1));
  const double p1 = 1 - p0;
  EXPECT_NEAR(r.out[0], p0 * 1 + p1 * 3, kTolerance);
  EXPECT_NEAR(r.out[1], p0 * 2 + p1 * -1, kTolerance);
  EXPECT_NEAR(r.lse[0], std::log(std::exp(s0) + std::exp(s1)), kTolerance);
}

TEST(KnownValues, ExplicitScale) {
  Attention a = two_keys(0.5f, 0.f);
  for_each_path(a, [](const reference::ForwardResult& r) { expect_two_key_result(r, 0.5, 1.0); });
}

TEST(KnownValues, DefaultScaleIsInverseSqrtHeadDim) {
  Attention a = two_keys(0.f, 0.f);
  const double scale = 1 / std::sqrt(2.0);
  for_each_path(a, [&](const reference::ForwardResult& r) { expect_two_key_result(r, scale, 2 * scale); });
}

// Values of three elements for keys of two: scores 0.5 and 1 as above, the default scale
// 1/sqrt(2) (q's head dim, not v's), and out of v's head dim.
TEST(KnownValues, ValuesOfTheirOwnHeadDim) {
  for (float scale : {0.5f, 0.f}) {
    Case c;
    c.seqlen_k = 2;
    c.head_dim = 2;
    c.head_dim_v = 3;
    c.softmax_scale = scale;
    Attention a = make_attention(c, 1);
    const float q[] = {1, 2}, k[2][2] = {{1, 0}, {0, 1}}, v[2][3] = {{1, 2, 0.5f}, {3, -1, -4}};
    for (std::int64_t d = 0; d < 2; ++d) a.q.set({0, 0, 0, d}, q[d]);
    for (std::int64_t j = 0; j < 2; ++j) {
      for (std::int64_t d = 0; d < 2; ++d) a.k.set({0, j, 0, d}, k[j][d]);
      for (std::int64_t d = 0; d < 3; ++d) a.v.set({0, j, 0, d}, v[j][d]);
    }
    const double s = scale > 0 ? 0.5 : 1 / std::sqrt(2.0);
    const double p0 = std::exp(s) / (std::exp(s) + std::exp(2 * s)), p1 = 1 - p0;
    for_each_path(a, [&](const reference::ForwardResult& r) {
      ASSERT_EQ(r.out.size(), 3u);
      for (std::size_t d = 0; d < 3; ++d) EXPECT_NEAR(r.out[d], p0 * v[0][d] + p1 * v[1][d], kTolerance) << d;
      EXPECT_NEAR(r.lse[0], std::log(std::exp(s) + std::exp(2 * s)), kTolerance);
    });
  }
}

TEST(KnownValues, SoftcapAppliesToScaledScores) {
  Attention a = two_keys(0.5f, 0.8f);
  for_each_path(a, [](const reference::ForwardResult& r) {
    expect_two_key_result(r, 0.8 * std::tanh(0.5 / 0.8), 0.8 * std::tanh(1.0 / 0.8));
  });
}

// Scores 0.5 and 1 with a sink of 0.25, by hand: the denominator is e^0.5 + e^1 + e^0.25
// = 5.651029, so P = 0.291756 and 0.481024 (the sink keeps the remaining 0.227220),
// out = 0.291756 [1, 2] + 0.481024 [3, -1] and lse = log(5.651029).
TEST(KnownValues, SinkJoinsTheDenominatorWithoutAValue) {
  Attention a = two_keys(0.5f, 0.f);
  set_sinks(a, {0.25f});
  for_each_path(a, [](const reference::ForwardResult& r) {
    EXPECT_NEAR(r.out[0], 1.7348288, kTolerance);
    EXPECT_NEAR(r.out[1], 0.1024877, kTolerance);
    EXPECT_NEAR(r.lse[0], 1.7318376, kTolerance);
  });
}

// With every key the same, every visible key gets the same weight, so each output
// row is the mean of the values it may see.
TEST(KnownValues, IdenticalKeysGiveTheMeanOfVisibleValues) {
  Case masks[7];
  masks[1].causal = true;
  masks[2].window_left = 2;
  masks[2].window_right = 1;
  masks[3].causal = true;
  masks[3].window_left = 3;
  // Chunked attention: alone, causal, and with a window crossing chunk edges.
  masks[4].attention_chunk = 8;
  masks[5].causal = true;
  masks[5].attention_chunk = 5;
  masks[6].window_left = 4;
  masks[6].window_right = 3;
  masks[6].attention_chunk = 6;
  for (Case c : masks) {
    c.batch = 2;
    c.seqlen_q = 21;
    c.seqlen_k = 37;
    c.nheads_q = 4;
    c.nheads_kv = 2;
    c.head_dim = 24;
    c.head_dim_v = c.causal ? 40 : 0;  // a V head dim of its own on half the masks
    SCOPED_TRACE(c.name());
    Attention a = make_attention(c, 7);
    a.k.for_each([&](const Index& i, std::int64_t) { a.k.set(i, a.k.get({i[0], 0, i[2], i[3]})); });

    for_each_path(a, [&](const reference::ForwardResult& r) {
      for (std::int64_t b = 0; b < c.batch; ++b) {
        for (std::int64_t h = 0; h < c.nheads_q; ++h) {
          for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
            const std::int64_t first = first_key(c, i), last = last_key(c, i);
            for (std::int64_t d = 0; d < c.value_dim(); ++d) {
              double mean = 0;
              for (std::int64_t j = first; j <= last; ++j) mean += a.v.get({b, j, h / 2, d});
              mean /= static_cast<double>(last - first + 1);
              ASSERT_NEAR(r.out[out_at(c, b, i, h, d)], mean, kTolerance) << "b " << b << " h " << h << " i " << i;
            }
          }
        }
      }
    });
  }
}

// A query row that sees no key: out exactly 0 and lse -inf, never NaN. With 16-row
// tiles, the first query blocks of these cases are entirely masked.
TEST(KnownValues, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  Case causal;
  causal.seqlen_q = 40;
  causal.seqlen_k = 7;
  causal.causal = true;
  Case window;
  window.seqlen_q = 45;
  window.seqlen_k = 9;
  window.window_left = 2;
  window.window_right = 1;
  // Queries before key 0 sit in chunks of their own, which hold no key.
  Case chunked = causal;
  chunked.attention_chunk = 3;
  for (Case c : {causal, window, chunked}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      c.dtype = dtype;
      c.batch = 2;
      c.nheads_q = 2;
      c.head_dim = 32;
      c.head_dim_v = dtype == DType::kFloat32 ? 16 : 0;
      SCOPED_TRACE(c.name());
      Attention a = make_attention(c, 9);
      std::int64_t masked_rows = 0;
      for_each_path(a, [&](const reference::ForwardResult& r) {
        masked_rows = 0;
        for (std::int64_t b = 0; b < c.batch; ++b) {
          for (std::int64_t h = 0; h < c.nheads_q; ++h) {
            for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
              const bool masked = first_key(c, i) > last_key(c, i);
              masked_rows += masked;
              const double lse = r.lse[lse_at(c, b, h, i)];
              if (masked) {
                EXPECT_EQ(lse, kNegInf) << "row " << i;
              } else {
                EXPECT_TRUE(std::isfinite(lse)) << "row " << i;
              }
              for (std::int64_t d = 0; d < c.value_dim(); ++d) {
                const double o = r.out[out_at(c, b, i, h, d)];
                if (masked) {
                  ASSERT_EQ(o, 0.0) << "row " << i;
                } else {
                  ASSERT_TRUE(std::isfinite(o)) << "row " << i;
                }
              }
            }
          }
        }
      });
      EXPECT_GT(masked_rows, c.batch * c.nheads_q * 32);  // more than two whole 16-row tiles per head
    }
  }
}

// With sinks, a query row that sees no key keeps only its head's sink: out exactly 0 and
// lse the sink (to the fp32 rounding of the tiled path's base-2 units); other rows
// stay finite. Causal and GQA, so that each query head must read its own sink.
TEST(KnownValues, RowsThatSeeNoKeyGiveZeroAndTheirSink) {
  Case c;
  c.batch = 2;
  c.seqlen_q = 40;
  c.seqlen_k = 7;
  c.nheads_q = 4;
  c.nheads_kv = 2;
  c.head_dim = 32;
  c.causal = true;
  c.sinks_stddev = 2.f;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    c.dtype = dtype;
    SCOPED_TRACE(c.name());
    Attention a = make_attention(c, 10);
    for_each_path(a, [&](const reference::ForwardResult& r) {
      for (std::int64_t b = 0; b < c.batch; ++b) {
        for (std::int64_t h = 0; h < c.nheads_q; ++h) {
          const double sink = a.sinks.get({h});
          for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
            const bool masked = first_key(c, i) > last_key(c, i);
            const double lse = r.lse[lse_at(c, b, h, i)];
            if (masked) {
              EXPECT_NEAR(lse, sink, kTolerance) << "row " << i;
            } else {
              EXPECT_TRUE(std::isfinite(lse)) << "row " << i;
            }
            for (std::int64_t d = 0; d < c.value_dim(); ++d) {
              const double o = r.out[out_at(c, b, i, h, d)];
              if (masked) {
                ASSERT_EQ(o, 0.0) << "row " << i;
              } else {
                ASSERT_TRUE(std::isfinite(o)) << "row " << i;
              }
            }
          }
        }
      }
    });
  }
}

// A sink of -inf weighs nothing: every path gives bitwise the results it gives without
// sinks, masked rows (lse -inf) included.
TEST(KnownValues, MinusInfinitySinksAreNoSinks) {
  Case c;
  c.batch = 2;
  c.seqlen_q = 45;
  c.seqlen_k = 30;
  c.nheads_q = 4;
  c.nheads_kv = 2;
  c.head_dim = 24;
  c.causal = true;
  c.window_left = 9;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    c.dtype = dtype;
    SCOPED_TRACE(c.name());
    Attention plain = make_attention(c, 11);
    Attention sunk = make_attention(c, 11);
    set_sinks(sunk, std::vector<float>(4, -std::numeric_limits<float>::infinity()));
    for (const ForwardPath& path : forward_paths()) {
      SCOPED_TRACE(path.name);
      const reference::ForwardResult want = path.run(plain);
      const reference::ForwardResult got = path.run(sunk);
      EXPECT_EQ(got.out, want.out);
      EXPECT_EQ(got.lse, want.lse);
    }
  }
}

// One key: its weight is exactly 1, so out is exactly that key's value row and lse
// its scaled score; v's head dim is 72, q's 40.
TEST(KnownValues, SingleKeyReturnsItsValue) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    Case c;
    c.batch = 2;
    c.seqlen_q = 19;
    c.nheads_q = 3;
    c.head_dim = 40;
    c.head_dim_v = 72;
    c.dtype = dtype;
    SCOPED_TRACE(c.name());
    Attention a = make_attention(c, 13);
    const double scale = a.problem.softmax_scale;
    for_each_path(a, [&](const reference::ForwardResult& r) {
      for (std::int64_t b = 0; b < c.batch; ++b) {
        for (std::int64_t h = 0; h < c.nheads_q; ++h) {
          for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
            for (std::int64_t d = 0; d < c.value_dim(); ++d) {
              ASSERT_EQ(r.out[out_at(c, b, i, h, d)], a.v.get({b, 0, 0, d}));
            }
            double score = 0;
            for (std::int64_t d = 0; d < c.head_dim; ++d) score += double{a.q.get({b, i, h, d})} * a.k.get({b, 0, 0, d});
            // kLikeInputs rounds the raw score to the input dtype.
            EXPECT_NEAR(r.lse[lse_at(c, b, h, i)], scale * score,
                        kTolerance + storage_rounding(dtype) * scale * std::fabs(score));
          }
        }
      }
    });
  }
}

}  // namespace
}  // namespace fa3::testing
