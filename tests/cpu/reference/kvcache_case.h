// A KV-cache call for the tests: sequences' valid keys drawn at random, the cache laid out
// contiguous (with cache_batch_idx or not) or paged in random page order, NaN wherever a
// sequence has no valid entry, and the expected keys, values and queries of each sequence
// built outside the library, rotary embedding included (in fp64).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fa3/kvcache.h"
#include "host_tensor.h"

namespace fa3::testing {

struct KvCase {
  std::string name;
  std::int64_t seqlen_q = 1;
  std::int64_t nheads_q = 4;
  std::int64_t nheads_kv = 2;
  std::int64_t head_dim = 32;
  std::int64_t head_dim_v = 32;
  DType dtype = DType::kBFloat16;
  std::vector<std::int32_t> seqlens;     // cache_seqlens: one per sequence
  std::vector<std::int32_t> leftpad;     // cache_leftpad; empty: none
  std::vector<std::int32_t> batch_idx;   // cache_batch_idx (contiguous only); empty: none
  std::vector<std::int32_t> rotary_pos;  // rotary_seqlens; empty: none
  std::int64_t capacity = 64;            // positions per sequence
  std::int64_t page_size = 0;            // 0: a contiguous cache
  std::int64_t seqlen_new = 0;           // rows of k_new / v_new; 0: none
  std::int64_t rotary_dim = 0;           // 0: none
  bool interleaved = true;
  AttentionOptions options;
  bool sinks = false;

  std::int64_t batch() const { return static_cast<std::int64_t>(seqlens.size()); }
  std::int32_t left(std::int64_t b) const { return leftpad.empty() ? 0 : leftpad[static_cast<std::size_t>(b)]; }
  std::int32_t seqlen(std::int64_t b) const { return seqlens[static_cast<std::size_t>(b)]; }
  std::int64_t seqlen_k(std::int64_t b) const { return seqlen(b) + seqlen_new - left(b); }
  std::int64_t rotary_start(std::int64_t b) const {
    return rotary_pos.empty() ? seqlen(b) : rotary_pos[static_cast<std::size_t>(b)];
  }
};

inline HostTensor int32_tensor(const std::vector<std::int32_t>& values) {
  HostTensor t(DType::kInt32, {static_cast<std::int64_t>(values.size())});
  std::copy(values.begin(), values.end(), static_cast<std::int32_t*>(t.data()));
  return t;
}

// The inputs of a KV-cache call and, per sequence, what it should attend over.
struct KvCall {
  KvCase c;
  HostTensor q, out, lse, sinks;
  HostTensor k_logical, v_logical;  // (batch, capacity, ...): sequence b's cache as it reads
  HostTensor k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin;
  HostTensor seqlens, leftpad, batch_idx, rotary_pos, page_table;
  std::vector<std::int64_t> cache_rows;  // contiguous: the cache row of each sequence
  std::vector<std::int64_t> pages;       // paged: the page of (sequence b, page j) at b * pages_per_seq + j

  std::int64_t pages_per_seq() const { return (c.capacity + c.page_size - 1) / c.page_size; }

  // Element offset of (b, pos, h, 0) in a cache of this layout.
  std::int64_t cache_offset(const HostTensor& cache, std::int64_t b, std::int64_t pos, std::int64_t h) const {
    if (c.page_size == 0) return cache.offset({cache_rows[static_cast<std::size_t>(b)], pos, h, 0});
    const std::int64_t page = pages[static_cast<std::size_t>(b * pages_per_seq() + pos / c.page_size)];
    return cache.offset({page, pos % c.page_size, h, 0});
  }

  float cache_get(const HostTensor& cache, std::int64_t b, std::int64_t pos, std::int64_t h, std::int64_t d) const {
    return numeric::load_as_float(cache.data(), cache_offset(cache, b, pos, h) + d, cache.dtype());
  }

  KvCacheArgs args() {
    KvCacheArgs a;
    a.q = q.view();
    a.k_cache = k_cache.view();
    a.v_cache = v_cache.view();
    a.cache_seqlens = seqlens.view();
    if (c.page_size > 0) a.page_table = page_table.view();
    if (!c.batch_idx.empty()) a.cache_batch_idx = batch_idx.view();
    if (!c.leftpad.empty()) a.cache_leftpad = leftpad.view();
    if (c.seqlen_new > 0) {
      a.k_new = k_new.view();
      a.v_new = v_new.view();
    }
    if (c.rotary_dim > 0) {
      a.rotary_cos = rotary_cos.view();
      a.rotary_sin = rotary_sin.view();
      a.rotary_interleaved = c.interleaved;
      if (!c.rotary_pos.empty()) a.rotary_seqlens = rotary_pos.view();
    }
    a.out = out.view();
    a.lse = lse.view();
    if (c.sinks) a.sinks = sinks.view();
    a.options = c.options;
    return a;
  }

  // Rotates x (the first rotary_dim of its values) by position `pos`, in fp64 from the
  // tables' values, rounded to the dtype on the way out.
  void rotate(std::vector<double>& x, std::int64_t pos) const {
    const std::int64_t half = c.rotary_dim / 2;
    for (std::int64_t i = 0; i < half; ++i) {
      const double co = rotary_cos.get({pos, i, 0, 0});
      const double si = rotary_sin.get({pos, i, 0, 0});
      const std::size_t i0 = static_cast<std::size_t>(c.interleaved ? 2 * i : i);
      const std::size_t i1 = static_cast<std::size_t>(c.interleaved ? 2 * i + 1 : i + half);
      const double x0 = x[i0], x1 = x[i1];
      x[i0] = x0 * co - x1 * si;
      x[i1] = x0 * si + x1 * co;
    }
    for (double& v : x) v = numeric::round_to(c.dtype, static_cast<float>(v));
  }

  // Row (b, s, h) of a 4-d tensor, rotated by `pos` when the call has a rotary embedding.
  std::vector<double> row(const HostTensor& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t pos,
                          std::int64_t dim) const {
    std::vector<double> x(static_cast<std::size_t>(dim));
    for (std::size_t d = 0; d < x.size(); ++d) x[d] = t.get({b, s, h, static_cast<std::int64_t>(d)});
    if (c.rotary_dim > 0) rotate(x, pos);
    return x;
  }

  // Sequence b as a fixed-length call of batch 1: the keys it should see (valid cache
  // entries, then the new rows rotated), its queries rotated; needs seqlen_k(b) >= 1.
  Attention expected_inputs(std::int64_t b) const {
    const std::int64_t sk = c.seqlen_k(b);
    Attention e;
    e.q = HostTensor(c.dtype, {1, c.seqlen_q, c.nheads_q, c.head_dim});
    e.k = HostTensor(c.dtype, {1, sk, c.nheads_kv, c.head_dim});
    e.v = HostTensor(c.dtype, {1, sk, c.nheads_kv, c.head_dim_v});
    e.out = HostTensor(c.dtype, {1, c.seqlen_q, c.nheads_q, c.head_dim_v});
    e.lse = HostTensor(DType::kFloat32, {1, c.nheads_q, c.seqlen_q});
    const bool per_row = c.options.causal || c.options.window_left >= 0 || c.options.window_right >= 0;
    for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
      for (std::int64_t h = 0; h < c.nheads_q; ++h) {
        const std::vector<double> x = row(q, b, i, h, c.rotary_start(b) + (per_row ? i : 0), c.head_dim);
        for (std::size_t d = 0; d < x.size(); ++d)
          e.q.set({0, i, h, static_cast<std::int64_t>(d)}, static_cast<float>(x[d]));
      }
    }
    for (std::int64_t j = 0; j < sk; ++j) {
      const std::int64_t pos = c.left(b) + j;
      const bool is_new = pos >= c.seqlen(b);
      for (std::int64_t h = 0; h < c.nheads_kv; ++h) {
        for (std::int64_t d = 0; d < c.head_dim_v; ++d) {
          e.v.set({0, j, h, d}, is_new ? v_new.get({b, pos - c.seqlen(b), h, d}) : v_logical.get({b, pos, h, d}));
        }
        if (is_new) {
          const std::vector<double> x =
              row(k_new, b, pos - c.seqlen(b), h, c.rotary_start(b) + pos - c.seqlen(b), c.head_dim);
          for (std::size_t d = 0; d < x.size(); ++d)
            e.k.set({0, j, h, static_cast<std::int64_t>(d)}, static_cast<float>(x[d]));
        } else {
          for (std::int64_t d = 0; d < c.head_dim; ++d) e.k.set({0, j, h, d}, k_logical.get({b, pos, h, d}));
        }
      }
    }
    e.out.fill_nan();
    e.lse.fill_nan();
    e.has_sinks = c.sinks;
    if (c.sinks) e.sinks = sinks;
    e.options = c.options;
    return e;
  }
};

inline KvCall make_kv_call(const KvCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  KvCall k;
  k.c = c;
  const std::int64_t batch = c.batch();
  k.q = HostTensor(c.dtype, {batch, c.seqlen_q, c.nheads_q, c.head_dim});
  k.q.fill_normal(rng);
  k.k_logical = HostTensor(c.dtype, {batch, c.capacity, c.nheads_kv, c.head_dim});
  k.v_logical = HostTensor(c.dtype, {batch, c.capacity, c.nheads_kv, c.head_dim_v});
  k.k_logical.fill_normal(rng);
  k.v_logical.fill_normal(rng);
  // Entries no sequence may read hold NaN: before leftpad and from cache_seqlens on.
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t pos = 0; pos < c.capacity; ++pos) {
      if (pos >= c.left(b) && pos < c.seqlen(b)) continue;
      for (std::int64_t h = 0; h < c.nheads_kv; ++h) {
        for (std::int64_t d = 0; d < c.head_dim; ++d) k.k_logical.set({b, pos, h, d}, NAN);
        for (std::int64_t d = 0; d < c.head_dim_v; ++d) k.v_logical.set({b, pos, h, d}, NAN);
      }
    }
  }
  if (c.page_size == 0) {
    const std::int64_t rows =
        c.batch_idx.empty() ? batch : *std::max_element(c.batch_idx.begin(), c.batch_idx.end()) + 2;
    k.k_cache = HostTensor(c.dtype, {rows, c.capacity, c.nheads_kv, c.head_dim});
    k.v_cache = HostTensor(c.dtype, {rows, c.capacity, c.nheads_kv, c.head_dim_v});
    for (std::int64_t b = 0; b < batch; ++b)
      k.cache_rows.push_back(c.batch_idx.empty() ? b : c.batch_idx[static_cast<std::size_t>(b)]);
  } else {
    // Two pages no sequence owns; the others dealt out in random order.
    const std::int64_t num_pages = batch * k.pages_per_seq() + 2;
    std::vector<std::int64_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    k.pages.assign(order.begin(), order.begin() + batch * k.pages_per_seq());
    k.k_cache = HostTensor(c.dtype, {num_pages, c.page_size, c.nheads_kv, c.head_dim});
    k.v_cache = HostTensor(c.dtype, {num_pages, c.page_size, c.nheads_kv, c.head_dim_v});
    k.page_table = HostTensor(DType::kInt32, {batch, k.pages_per_seq()});
    auto* table = static_cast<std::int32_t*>(k.page_table.data());
    for (std::size_t n = 0; n < k.pages.size(); ++n) table[n] = static_cast<std::int32_t>(k.pages[n]);
  }
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t pos = 0; pos < c.capacity; ++pos) {
      for (std::int64_t h = 0; h < c.nheads_kv; ++h) {
        for (std::int64_t d = 0; d < c.head_dim; ++d) {
          numeric::store_from_float(k.k_cache.data(), k.cache_offset(k.k_cache, b, pos, h) + d, c.dtype,
                                    k.k_logical.get({b, pos, h, d}));
        }
        for (std::int64_t d = 0; d < c.head_dim_v; ++d) {
          numeric::store_from_float(k.v_cache.data(), k.cache_offset(k.v_cache, b, pos, h) + d, c.dtype,
                                    k.v_logical.get({b, pos, h, d}));
        }
      }
    }
  }
  if (c.seqlen_new > 0) {
    k.k_new = HostTensor(c.dtype, {batch, c.seqlen_new, c.nheads_kv, c.head_dim});
    k.v_new = HostTensor(c.dtype, {batch, c.seqlen_new, c.nheads_kv, c.head_dim_v});
    k.k_new.fill_normal(rng);
    k.v_new.fill_normal(rng);
  }
  if (c.rotary_dim > 0) {
    // Angles as rotary embeddings use them: position times 10000^(-2i / rotary_dim).
    const std::int64_t seqlen_ro = c.capacity + c.seqlen_q;
    k.rotary_cos = HostTensor(c.dtype, {seqlen_ro, c.rotary_dim / 2});
    k.rotary_sin = HostTensor(c.dtype, {seqlen_ro, c.rotary_dim / 2});
    for (std::int64_t p = 0; p < seqlen_ro; ++p) {
      for (std::int64_t i = 0; i < c.rotary_dim / 2; ++i) {
        const double angle = static_cast<double>(p) *
                             std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(c.rotary_dim));
        k.rotary_cos.set({p, i, 0, 0}, static_cast<float>(std::cos(angle)));
        k.rotary_sin.set({p, i, 0, 0}, static_cast<float>(std::sin(angle)));
      }
    }
  }
  if (c.sinks) {
    k.sinks = HostTensor(DType::kFloat32, {c.nheads_q});
    k.sinks.fill_normal(rng, 2.f);
  }
  k.seqlens = int32_tensor(c.seqlens);
  if (!c.leftpad.empty()) k.leftpad = int32_tensor(c.leftpad);
  if (!c.batch_idx.empty()) k.batch_idx = int32_tensor(c.batch_idx);
  if (!c.rotary_pos.empty()) k.rotary_pos = int32_tensor(c.rotary_pos);
  k.out = HostTensor(c.dtype, {batch, c.seqlen_q, c.nheads_q, c.head_dim_v});
  k.lse = HostTensor(DType::kFloat32, {batch, c.nheads_q, c.seqlen_q});
  k.out.fill_nan();
  k.lse.fill_nan();
  return k;
}

}  // namespace fa3::testing
