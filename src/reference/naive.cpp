#include "reference/naive.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/numeric.h"

namespace fa3::reference {
namespace {

// The inputs every pass reads, as laid out in fa3::ForwardArgs (sinks may be undefined).
struct Inputs {
  const TensorView& q;
  const TensorView& k;
  const TensorView& v;
  const TensorView& sinks;
};

// Element (i0, i1, i2, i3) of a 4-d view, in 64-bit arithmetic.
std::int64_t element(const TensorView& t, std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) {
  return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2] + i3 * t.stride[3];
}

// Reads row (b, s, h, :) of a (batch, seqlen, nheads, head_dim) view. Inputs are
// fp32/fp16/bf16, so the value is exact in both float and double.
template <typename Real>
void load_row(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t head_dim,
              Real* dst) {
  const std::int64_t base = element(t, b, s, h, 0);
  for (std::int64_t d = 0; d < head_dim; ++d) {
    dst[d] = static_cast<Real>(numeric::load_as_float(t.data, base + d * t.stride[3], t.dtype));
  }
}

template <typename Real>
Real dot(const Real* a, const Real* b, std::int64_t n) {
  Real sum = 0;
  for (std::int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Query head h's sink logit: an fp32 input, exact in float and double. Without sinks
// -inf, which leaves a row's max alone and adds exactly 0 to its sum.
template <typename Real>
Real sink_of(const Inputs& in, std::int64_t head) {
  if (!in.sinks.defined()) return -std::numeric_limits<Real>::infinity();
  return static_cast<Real>(static_cast<const float*>(in.sinks.data)[head * in.sinks.stride[0]]);
}

// Rounds an intermediate to the inputs' dtype, where a naive low-precision
// implementation would store it in that dtype; the identity for the exact reference.
struct Rounding {
  bool enabled = false;
  DType dtype = DType::kFloat32;

  template <typename Real>
  Real operator()(Real x) const {
    return enabled ? static_cast<Real>(numeric::round_to(dtype, static_cast<float>(x))) : x;
  }
};

// The softmax of one query row over the keys it may see (and its head's sink).
template <typename Real>
struct RowSoftmax {
  std::int64_t first_key = 0;
  std::vector<Real> prob;   // probability of key first_key + n
  std::vector<Real> slope;  // d(softmax input) / d(q . k) for that key: the scale, times tanh' under softcap
  Real lse = -std::numeric_limits<Real>::infinity();  // with no key visible, the sink's logit alone
};

// Scores are q . k (accumulated in Real, then rounded like a stored score matrix),
// scaled, optionally capped (softcap * tanh(scaled / softcap)), then normalised. The
// sink joins the max and the sum as a score whose key has no value.
template <typename Real>
RowSoftmax<Real> row_softmax(const Problem& p, const Inputs& in, const RowRef& r, const Rounding& round) {
  RowSoftmax<Real> sm;
  const Real sink = sink_of<Real>(in, r.head);
  sm.lse = sink;
  const std::int64_t first = p.first_key(r.row);
  const std::int64_t last = p.last_key(r.row);
  if (first > last) return sm;
  sm.first_key = first;

  const std::int64_t d = p.head_dim;
  const std::int64_t kv_head = r.head / p.group_size();
  std::vector<Real> q(d), k(d);
  load_row(in.q, r.batch, r.row, r.head, d, q.data());

  const Real scale = static_cast<Real>(p.softmax_scale);
  const Real cap = static_cast<Real>(p.softcap);
  std::vector<Real> score;
  score.reserve(static_cast<std::size_t>(last - first + 1));
  sm.slope.reserve(score.capacity());
  for (std::int64_t j = first; j <= last; ++j) {
    load_row(in.k, r.batch, j, kv_head, d, k.data());
    Real s = round(dot(q.data(), k.data(), d)) * scale;
    Real slope = scale;
    if (cap > 0) {
      const Real t = std::tanh(s / cap);
      s = cap * t;
      slope = scale * (1 - t * t);
    }
    score.push_back(s);
    sm.slope.push_back(slope);
  }

  const Real max = std::max(sink, *std::max_element(score.begin(), score.end()));
  Real sum = std::exp(sink - max);
  for (Real& s : score) {
    s = std::exp(s - max);
    sum += s;
  }
  sm.prob.reserve(score.size());
  for (Real e : score) sm.prob.push_back(round(e / sum));
  sm.lse = max + std::log(sum);
  return sm;
}

// out[:] (head_dim_v values) = sum over visible keys of prob * v, accumulated in Real,
// rounded like a stored output.
template <typename Real>
void row_output(const Problem& p, const Inputs& in, const RowRef& r, const RowSoftmax<Real>& sm,
                const Rounding& round, Real* out) {
  const std::int64_t d = p.head_dim_v;
  const std::int64_t kv_head = r.head / p.group_size();
  std::fill(out, out + d, Real{0});
  std::vector<Real> v(d);
  for (std::size_t n = 0; n < sm.prob.size(); ++n) {
    load_row(in.v, r.batch, sm.first_key + static_cast<std::int64_t>(n), kv_head, d, v.data());
    for (std::int64_t c = 0; c < d; ++c) out[c] += sm.prob[n] * v[c];
  }
  for (std::int64_t c = 0; c < d; ++c) out[c] = round(out[c]);
}

// One query row of the forward pass: out (head_dim_v values) and lse.
template <typename Real>
void forward_row(const Problem& p, const Inputs& in, const RowRef& r, const Rounding& round, double* out,
                 double* lse) {
  const RowSoftmax<Real> sm = row_softmax<Real>(p, in, r, round);
  std::vector<Real> o(p.head_dim_v);
  row_output(p, in, r, sm, round, o.data());
  std::copy(o.begin(), o.end(), out);
  *lse = static_cast<double>(sm.lse);
}

// Offsets in the canonical contiguous layouts of the results, whose rows hold `dim`
// elements: head_dim for dq and dk, head_dim_v for out and dv.
std::int64_t q_index(const Problem& p, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t dim) {
  return ((b * p.seqlen_q + s) * p.nheads_q + h) * dim;
}
std::int64_t kv_index(const Problem& p, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t dim) {
  return ((b * p.seqlen_k + s) * p.nheads_kv + h) * dim;
}
std::int64_t lse_index(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t s) {
  return (b * p.nheads_q + h) * p.seqlen_q + s;
}

template <typename Real>
ForwardResult forward_all(const Problem& p, const Inputs& in, const Rounding& round) {
  ForwardResult res;
  res.out.resize(static_cast<std::size_t>(p.batch * p.seqlen_q * p.nheads_q * p.head_dim_v));
  res.lse.resize(static_cast<std::size_t>(p.batch * p.nheads_q * p.seqlen_q));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.nheads_q; ++h) {
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        forward_row<Real>(p, in, {b, h, i}, round, &res.out[q_index(p, b, i, h, p.head_dim_v)],
                          &res.lse[lse_index(p, b, h, i)]);
      }
    }
  }
  return res;
}

// Gradients of sum(out * dout), one query row at a time:
//   dP_j = dO . v_j,  D = dO . O,  dS_j = P_j (dP_j - D) * slope_j,
//   dq += dS_j k_j,  dk_j += dS_j q,  dv_j += P_j dO,
//   dsink -= exp(sink - lse) D.
// The sink's term: P_j = exp(s_j - lse) depends on the sink through lse = log(exp(sink)
// + sum_j exp(s_j)) alone, so d P_j / d sink = -P_j exp(sink - lse); the loss reaches P_j
// with weight dP_j, so it moves by sum_j dP_j (-P_j exp(sink - lse)) = -exp(sink - lse) D
// per unit of sink, exp(sink - lse) being the share of the row the sink takes (to a key
// without a value). Rows that see no key have O = 0, so D = 0.
// Query heads of a GQA group add into the same dk/dv rows; rows of every batch into
// their head's dsink. Emulating low precision, P, O, dP and dS (after the softcap slope
// and the scale) are rounded to the input dtype as a naive implementation would store
// them, sums stay fp32, and the gradients are rounded once at the end, except dsinks,
// which is fp32 whatever the inputs.
template <typename Real>
BackwardResult backward_all(const Problem& p, const Inputs& in, const TensorView& dout, const Rounding& round) {
  const std::int64_t d = p.head_dim, dv_dim = p.head_dim_v;
  std::vector<Real> dq(static_cast<std::size_t>(p.batch * p.seqlen_q * p.nheads_q * d));
  std::vector<Real> dk(static_cast<std::size_t>(p.batch * p.seqlen_k * p.nheads_kv * d));
  std::vector<Real> dv(static_cast<std::size_t>(p.batch * p.seqlen_k * p.nheads_kv * dv_dim));
  std::vector<Real> dsinks(in.sinks.defined() ? static_cast<std::size_t>(p.nheads_q) : 0);
  std::vector<Real> q(d), k(d), v(dv_dim), o(dv_dim), dO(dv_dim);

  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.nheads_q; ++h) {
      const std::int64_t kv_head = h / p.group_size();
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        const RowRef r{b, h, i};
        const RowSoftmax<Real> sm = row_softmax<Real>(p, in, r, round);
        if (sm.prob.empty()) continue;  // a fully masked row has no gradient
        row_output(p, in, r, sm, round, o.data());
        load_row(in.q, b, i, h, d, q.data());
        load_row(dout, b, i, h, dv_dim, dO.data());
        const Real delta = dot(dO.data(), o.data(), dv_dim);
        if (!dsinks.empty()) dsinks[h] -= std::exp(sink_of<Real>(in, h) - sm.lse) * delta;
        Real* dq_row = &dq[q_index(p, b, i, h, d)];
        for (std::size_t n = 0; n < sm.prob.size(); ++n) {
          const std::int64_t j = sm.first_key + static_cast<std::int64_t>(n);
          load_row(in.k, b, j, kv_head, d, k.data());
          load_row(in.v, b, j, kv_head, dv_dim, v.data());
          const Real dp = round(dot(dO.data(), v.data(), dv_dim));
          const Real ds = round(sm.prob[n] * (dp - delta) * sm.slope[n]);
          Real* dk_row = &dk[kv_index(p, b, j, kv_head, d)];
          Real* dv_row = &dv[kv_index(p, b, j, kv_head, dv_dim)];
          for (std::int64_t c = 0; c < d; ++c) {
            dq_row[c] += ds * k[c];
            dk_row[c] += ds * q[c];
          }
          for (std::int64_t c = 0; c < dv_dim; ++c) dv_row[c] += sm.prob[n] * dO[c];
        }
      }
    }
  }

  auto finish = [&](const std::vector<Real>& g) {
    std::vector<double> res(g.size());
    std::transform(g.begin(), g.end(), res.begin(), [&](Real x) { return static_cast<double>(round(x)); });
    return res;
  };
  return {finish(dq), finish(dk), finish(dv), {dsinks.begin(), dsinks.end()}};
}

void check_row(const Problem& p, const RowRef& r) {
  if (r.batch < 0 || r.batch >= p.batch || r.head < 0 || r.head >= p.nheads_q || r.row < 0 || r.row >= p.seqlen_q) {
    throw std::out_of_range("forward_rows: row (batch " + std::to_string(r.batch) + ", head " +
                            std::to_string(r.head) + ", row " + std::to_string(r.row) + ") is outside the problem");
  }
}

}  // namespace

ForwardResult forward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                      Precision precision, const TensorView& sinks) {
  const Inputs in{q, k, v, sinks};
  if (precision == Precision::kExact) return forward_all<double>(p, in, Rounding{});
  return forward_all<float>(p, in, Rounding{true, q.dtype});
}

ForwardResult forward_rows(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::vector<RowRef>& rows, const TensorView& sinks) {
  const Inputs in{q, k, v, sinks};
  ForwardResult res;
  res.out.resize(rows.size() * static_cast<std::size_t>(p.head_dim_v));
  res.lse.resize(rows.size());
  for (std::size_t n = 0; n < rows.size(); ++n) {
    check_row(p, rows[n]);
    forward_row<double>(p, in, rows[n], Rounding{}, &res.out[n * static_cast<std::size_t>(p.head_dim_v)], &res.lse[n]);
  }
  return res;
}

BackwardResult backward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& dout, Precision precision, const TensorView& sinks) {
  const Inputs in{q, k, v, sinks};
  if (precision == Precision::kExact) return backward_all<double>(p, in, dout, Rounding{});
  return backward_all<float>(p, in, dout, Rounding{true, q.dtype});
}

}  // namespace fa3::reference
