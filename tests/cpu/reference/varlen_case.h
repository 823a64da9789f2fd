// Variable-length (varlen) attention problems for the reference tests: packed q, k, v
// with NaN in every row that takes part in no sequence, the index tensors, and each
// sequence cut out into a fixed-length problem of its own, the oracle a varlen call
// must equal.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "host_tensor.h"

namespace fa3::testing {

struct VarlenCase {
  std::string name;                  // gtest parameter name
  std::vector<std::int32_t> q_lens;  // each sequence's query rows in cu_seqlens_q
  std::vector<std::int32_t> k_lens;  // and its keys in cu_seqlens_k
  std::vector<std::int32_t> q_used;  // seqused_q; empty: none
  std::vector<std::int32_t> k_used;  // seqused_k; empty: none
  std::int64_t extra_q = 0;          // rows of q past cu_seqlens_q[batch]
  std::int64_t extra_k = 0;          // rows of k and v past cu_seqlens_k[batch]
  bool strided = false;              // heads outermost in storage, with padding
  // Heads, head dims, dtype, mask options and sinks; its batch and seqlens are unused.
  Case base;

  std::int64_t batch() const { return static_cast<std::int64_t>(q_lens.size()); }
  std::int64_t used_q(std::int64_t b) const { return (q_used.empty() ? q_lens : q_used)[static_cast<std::size_t>(b)]; }
  std::int64_t used_k(std::int64_t b) const { return (k_used.empty() ? k_lens : k_used)[static_cast<std::size_t>(b)]; }
};

// gtest prints a parameter in failure messages: the name says it all.
inline void PrintTo(const VarlenCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<std::int32_t> offsets(const std::vector<std::int32_t>& lens) {
  std::vector<std::int32_t> cu{0};
  for (std::int32_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// (total, nheads, dim) rows tensors and the (nheads, total) lse, contiguous or strided.
inline Layout packed_layout(bool strided) { return strided ? Layout{{2, 1, 0, 0}, {1, 0, 2, 3}} : Layout{}; }
inline Layout packed_lse_layout(bool strided) { return strided ? Layout{{1, 3, 0, 0}, {1, 0, 2, 3}} : Layout{}; }

struct VarlenAttention {
  VarlenCase c;
  HostTensor q, k, v, out, lse, sinks;
  std::vector<std::int32_t> cu_q, cu_k, used_q, used_k;
  Problem problem;

  TensorView index(std::vector<std::int32_t>& values) {
    if (values.empty()) return {};
    return TensorView::contiguous(values.data(), DType::kInt32, {static_cast<std::int64_t>(values.size())});
  }

  VarlenArgs varlen() {
    VarlenArgs v;
    v.cu_seqlens_q = index(cu_q);
    v.cu_seqlens_k = index(cu_k);
    v.seqused_q = index(used_q);
    v.seqused_k = index(used_k);
    for (std::int64_t b = 0; b < c.batch(); ++b) {
      v.max_seqlen_q = std::max<int>(v.max_seqlen_q, static_cast<int>(c.used_q(b)));
      v.max_seqlen_k = std::max<int>(v.max_seqlen_k, static_cast<int>(c.used_k(b)));
    }
    return v;
  }

  TensorView sinks_view() { return c.base.sinks_stddev > 0.f ? sinks.view() : TensorView{}; }

  ForwardArgs args() {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.sinks = sinks_view();
    a.options = c.base.options();
    a.varlen = varlen();
    return a;
  }

  // Whether packed row `row` takes part in a sequence, by the offsets and used counts.
  static bool row_used(const std::vector<std::int32_t>& cu, std::int64_t row,
                       const std::function<std::int64_t(std::int64_t)>& used) {
    for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
      if (row >= cu[b] && row < cu[b] + used(static_cast<std::int64_t>(b))) return true;
    }
    return false;
  }
  bool q_row_used(std::int64_t row) const {
    return row_used(cu_q, row, [&](std::int64_t b) { return c.used_q(b); });
  }
  bool k_row_used(std::int64_t row) const {
    return row_used(cu_k, row, [&](std::int64_t b) { return c.used_k(b); });
  }
};

// NaN in every element of the rows that take part in no sequence.
template <class Used>
void poison_unused_rows(HostTensor& t, Used used) {
  t.for_each([&](const Index& i, std::int64_t) {
    if (!used(i[0])) t.set(i, NAN);
  });
}

inline VarlenAttention make_varlen(const VarlenCase& c, std::uint64_t seed) {
  VarlenAttention a;
  a.c = c;
  a.cu_q = offsets(c.q_lens);
  a.cu_k = offsets(c.k_lens);
  a.used_q = c.q_used;
  a.used_k = c.k_used;
  const Case& b = c.base;
  const std::int64_t total_q = a.cu_q.back() + c.extra_q, total_k = a.cu_k.back() + c.extra_k;
  const Layout rows = packed_layout(c.strided);
  a.q = HostTensor(b.dtype, {total_q, b.nheads_q, b.head_dim}, rows);
  a.k = HostTensor(b.dtype, {total_k, b.nheads_kv, b.head_dim}, rows);
  a.v = HostTensor(b.dtype, {total_k, b.nheads_kv, b.value_dim()}, rows);
  a.out = HostTensor(b.dtype, {total_q, b.nheads_q, b.value_dim()}, rows);
  a.lse = HostTensor(DType::kFloat32, {b.nheads_q, total_q}, packed_lse_layout(c.strided));
  std::mt19937_64 rng(seed);
  a.q.fill_normal(rng);
  a.k.fill_normal(rng);
  a.v.fill_normal(rng);
  if (b.sinks_stddev > 0.f) {
    a.sinks = HostTensor(DType::kFloat32, {b.nheads_q});
    a.sinks.fill_normal(rng, b.sinks_stddev);
  }
  poison_unused_rows(a.q, [&](std::int64_t r) { return a.q_row_used(r); });
  poison_unused_rows(a.k, [&](std::int64_t r) { return a.k_row_used(r); });
  poison_unused_rows(a.v, [&](std::int64_t r) { return a.k_row_used(r); });
  const Status st = validate_forward(a.args(), cpu_target(), &a.problem);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return a;
}

// Rows [start, start + rows) of a packed (total, nheads, dim) tensor, copied into a
// contiguous fixed-length (1, rows, nheads, dim) tensor of their own.
inline HostTensor cut_rows(HostTensor& packed, std::int64_t start, std::int64_t rows) {
  const TensorView view = packed.view();
  HostTensor t(packed.dtype(), {1, rows, view.shape[1], view.shape[2]});
  t.for_each([&](const Index& i, std::int64_t) { t.set(i, packed.get({start + i[1], i[2], i[3], 0})); });
  return t;
}

}  // namespace fa3::testing
