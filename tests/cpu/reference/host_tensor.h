// Host tensors for the reference tests: random normal contents, optional padding and
// permuted storage (strided views), NaN in every element outside the view.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "api/problem.h"
#include "api/validate.h"
#include "common/numeric.h"
#include "fa3/attention.h"

namespace fa3::testing {

using Index = std::array<std::int64_t, 4>;

// How a tensor is stored: `pad` extra elements after each dimension (they hold NaN
// and lie outside the view) and `order`, the storage order of the dimensions,
// outermost first. The last dimension of q/k/v/out must stay innermost.
struct Layout {
  Index pad{};
  std::array<int, 4> order{0, 1, 2, 3};
};

// (b, s, h, d) views into (b, h, s, d) storage with padding in every dimension: a
// strided, non-contiguous layout whose last dimension is contiguous.
inline Layout strided_layout() { return {{1, 3, 2, 5}, {0, 2, 1, 3}}; }
// (b, h, s) lse views into (s, b, h) storage with padding.
inline Layout strided_lse_layout() { return {{2, 1, 3, 0}, {2, 0, 1, 3}}; }

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<std::int64_t> shape, const Layout& layout = {})
      : dtype_(dtype), rank_(static_cast<int>(shape.size())), layout_(layout) {
    std::int64_t stride = 1;
    for (int n = rank_ - 1; n >= 0; --n) {
      const int dim = layout_.order[n];
      shape_[dim] = shape[dim];
      stride_[dim] = stride;
      stride *= shape[dim] + layout_.pad[dim];
    }
    elements_ = stride;
    bytes_.resize(static_cast<std::size_t>(elements_) * dtype_size(dtype_) / sizeof(std::uint64_t) + 1);
    for (std::int64_t n = 0; n < elements_; ++n) numeric::store_from_float(data(), n, dtype_, NAN);
  }

  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  DType dtype() const { return dtype_; }

  TensorView view() {
    TensorView t;
    t.data = data();
    t.dtype = dtype_;
    t.rank = rank_;
    for (int d = 0; d < rank_; ++d) {
      t.shape[d] = shape_[d];
      t.stride[d] = stride_[d];
    }
    return t;
  }

  std::int64_t offset(const Index& i) const {
    std::int64_t off = 0;
    for (int d = 0; d < rank_; ++d) off += i[d] * stride_[d];
    return off;
  }
  float get(const Index& i) const { return numeric::load_as_float(data(), offset(i), dtype_); }
  void set(const Index& i, float value) { numeric::store_from_float(data(), offset(i), dtype_, value); }

  // Calls f(index, canonical_position) for every element of the view, in the
  // row-major order of its shape (the order of the reference's result vectors).
  template <typename F>
  void for_each(F&& f) const {
    Index i{};
    std::int64_t pos = 0;
    for_each_from(0, i, pos, f);
  }

  // Fresh standard normal values, rounded to the dtype.
  void fill_normal(std::mt19937_64& rng, float stddev = 1.f) {
    std::normal_distribution<float> dist(0.f, stddev);
    for_each([&](const Index& i, std::int64_t) { set(i, dist(rng)); });
  }
  void fill_nan() {
    for_each([&](const Index& i, std::int64_t) { set(i, NAN); });
  }

  // Every element outside the view still holds NaN.
  bool padding_is_nan() const {
    for (std::int64_t n = 0; n < elements_; ++n) {
      if (inside_view(n)) continue;
      if (!std::isnan(numeric::load_as_float(data(), n, dtype_))) return false;
    }
    return true;
  }

  // Values of the view in canonical order, as the reference returns them.
  std::vector<double> values() const {
    std::vector<double> v;
    for_each([&](const Index& i, std::int64_t) { v.push_back(get(i)); });
    return v;
  }

 private:
  template <typename F>
  void for_each_from(int d, Index& i, std::int64_t& pos, F& f) const {
    if (d == rank_) {
      f(i, pos++);
      return;
    }
    for (i[d] = 0; i[d] < shape_[d]; ++i[d]) for_each_from(d + 1, i, pos, f);
  }

  // Decodes storage position n into coordinates and checks each against the shape.
  bool inside_view(std::int64_t n) const {
    for (int k = rank_ - 1; k >= 0; --k) {
      const int dim = layout_.order[k];
      const std::int64_t extent = shape_[dim] + layout_.pad[dim];
      if (n % extent >= shape_[dim]) return false;
      n /= extent;
    }
    return true;
  }

  DType dtype_ = DType::kFloat32;
  int rank_ = 0;
  Layout layout_;
  Index shape_{};
  Index stride_{};
  std::int64_t elements_ = 0;
  std::vector<std::uint64_t> bytes_;
};

// One attention problem as the tests describe it.
struct Case {
  std::int64_t batch = 1;
  std::int64_t seqlen_q = 1;
  std::int64_t seqlen_k = 1;
  std::int64_t nheads_q = 1;
  std::int64_t nheads_kv = 1;
  std::int64_t head_dim = 64;
  std::int64_t head_dim_v = 0;  // of v and out (and dout, dv); 0: head_dim
  DType dtype = DType::kFloat32;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.f;
  float softmax_scale = 0.f;
  int attention_chunk = 0;
  // > 0: one sink per query head, drawn from N(0, sinks_stddev^2) after q, k, v; 0: none.
  float sinks_stddev = 0.f;
  Layout layout;      // of q, k, v and out
  Layout lse_layout;  // (batch, nheads, seqlen): only the first three entries are used

  std::int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }

  AttentionOptions options() const {
    AttentionOptions o;
    o.softmax_scale = softmax_scale;
    o.causal = causal;
    o.window_left = window_left;
    o.window_right = window_right;
    o.softcap = softcap;
    o.attention_chunk = attention_chunk;
    return o;
  }

  std::string name() const {
    std::ostringstream s;
    s << "b" << batch << " sq" << seqlen_q << " sk" << seqlen_k << " h" << nheads_q << ":" << nheads_kv << " d"
      << head_dim << (value_dim() != head_dim ? " dv" + std::to_string(value_dim()) : "") << " " << dtype_name(dtype)
      << (causal ? " causal" : "") << " window(" << window_left << "," << window_right << ")"
      << " softcap" << softcap << (attention_chunk > 0 ? " chunk" + std::to_string(attention_chunk) : "")
      << (layout.order[1] != 1 ? " strided" : "") << (sinks_stddev > 0.f ? " sinks" : "");
    return s.str();
  }
};

// Random inputs, NaN-filled outputs and the resolved Problem of one case.
struct Attention {
  HostTensor q, k, v, out, lse;
  HostTensor sinks;  // fp32 (nheads_q) when has_sinks
  bool has_sinks = false;
  AttentionOptions options;
  Problem problem;

  // The view of the sinks, undefined without them: what every entry point takes.
  TensorView sinks_view() { return has_sinks ? sinks.view() : TensorView{}; }

  ForwardArgs args() {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.sinks = sinks_view();
    a.options = options;
    return a;
  }
};

inline Attention make_attention(const Case& c, std::uint64_t seed) {
  Attention a;
  a.q = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.nheads_q, c.head_dim}, c.layout);
  a.k = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.nheads_kv, c.head_dim}, c.layout);
  a.v = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.nheads_kv, c.value_dim()}, c.layout);
  a.out = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.nheads_q, c.value_dim()}, c.layout);
  a.lse = HostTensor(DType::kFloat32, {c.batch, c.nheads_q, c.seqlen_q}, c.lse_layout);
  std::mt19937_64 rng(seed);
  a.q.fill_normal(rng);
  a.k.fill_normal(rng);
  a.v.fill_normal(rng);
  // Drawn after q, k and v, so that a case with sinks has the same q, k and v as one without.
  a.has_sinks = c.sinks_stddev > 0.f;
  if (a.has_sinks) {
    a.sinks = HostTensor(DType::kFloat32, {c.nheads_q});
    a.sinks.fill_normal(rng, c.sinks_stddev);
  }
  a.out.fill_nan();
  a.lse.fill_nan();
  a.options = c.options();
  const Status st = validate_forward(a.args(), cpu_target(), &a.problem);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return a;
}

// |got - want|, where NaN in either counts as infinitely far and equal infinities
// (the lse of a fully masked row) as equal.
inline double abs_error(double got, double want) {
  if (std::isnan(got) || std::isnan(want)) return std::numeric_limits<double>::infinity();
  if (std::isinf(got) || std::isinf(want)) return got == want ? 0 : std::numeric_limits<double>::infinity();
  return std::fabs(got - want);
}

inline double max_abs_error(const HostTensor& got, const std::vector<double>& want) {
  double worst = 0;
  got.for_each([&](const Index& i, std::int64_t n) {
    worst = std::max(worst, abs_error(got.get(i), want[static_cast<std::size_t>(n)]));
  });
  return worst;
}

inline double max_abs_error(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t n = 0; n < got.size(); ++n) worst = std::max(worst, abs_error(got[n], want[n]));
  return worst;
}

inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace fa3::testing
