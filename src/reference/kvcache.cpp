#include "reference/kvcache.h"

#include <cstddef>
#include <vector>

#include "common/numeric.h"

namespace fa3::reference {
namespace {

const std::int32_t* int32_values(const TensorView& t) { return static_cast<const std::int32_t*>(t.data); }

std::int32_t entry(const TensorView& t, std::int64_t b) { return int32_values(t)[b * t.stride[0]]; }

// The element offset of (position `pos`, head `h`) of sequence b in k_cache or v_cache:
// through its page, or in its cache row.
std::int64_t cache_offset(const KvCacheProblem& kp, const KvCacheArgs& a, const TensorView& cache, std::int64_t b,
                          std::int64_t pos, std::int64_t h) {
  if (kp.paged) {
    const std::int64_t page = int32_values(a.page_table)[b * a.page_table.stride[0] + pos / kp.page_size];
    return page * cache.stride[0] + (pos % kp.page_size) * cache.stride[1] + h * cache.stride[2];
  }
  const std::int64_t row = a.cache_batch_idx.defined() ? entry(a.cache_batch_idx, b) : b;
  return row * cache.stride[0] + pos * cache.stride[1] + h * cache.stride[2];
}

// Row (b, s, h) of a (batch, seqlen, nheads, dim) view, as floats.
void load_row(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h, std::vector<float>& row) {
  const std::int64_t base = b * t.stride[0] + s * t.stride[1] + h * t.stride[2];
  for (std::int64_t d = 0; d < t.shape[3]; ++d)
    row[static_cast<std::size_t>(d)] = numeric::load_as_float(t.data, base + d, t.dtype);
}

void store_row(void* data, std::int64_t base, DType dtype, const std::vector<float>& row) {
  for (std::size_t d = 0; d < row.size(); ++d) {
    numeric::store_from_float(data, base + static_cast<std::int64_t>(d), dtype, row[d]);
  }
}

// Writes k_new (rotated) and v_new at positions [span.appended, span.end) of sequence b.
void append(const KvCacheProblem& kp, const KvCacheArgs& a, std::int64_t b, const CacheSpan& span) {
  std::vector<float> k_row(static_cast<std::size_t>(kp.attention.head_dim));
  std::vector<float> v_row(static_cast<std::size_t>(kp.attention.head_dim_v));
  for (std::int64_t i = 0; i < kp.seqlen_new; ++i) {
    for (std::int64_t h = 0; h < kp.attention.nheads_kv; ++h) {
      load_row(a.k_new, b, i, h, k_row);
      load_row(a.v_new, b, i, h, v_row);
      if (kp.rotary_dim > 0) {
        apply_rotary(k_row.data(), kp.rotary_dim, a.rotary_cos, a.rotary_sin, span.rotary_pos + i,
                     a.rotary_interleaved);
      }
      const std::int64_t pos = span.appended + i;
      store_row(a.k_cache.data, cache_offset(kp, a, a.k_cache, b, pos, h), a.k_cache.dtype, k_row);
      store_row(a.v_cache.data, cache_offset(kp, a, a.v_cache, b, pos, h), a.v_cache.dtype, v_row);
    }
  }
}

// A contiguous (1, rows, nheads, dim) tensor of its own, for a sequence's gathered keys
// or rotated queries. One element at least, so that an empty one still has an address.
struct Owned {
  std::vector<std::uint64_t> storage;
  TensorView view;

  Owned(DType dtype, std::int64_t rows, std::int64_t nheads, std::int64_t dim) {
    const std::int64_t elements = rows * nheads * dim;
    storage.resize(static_cast<std::size_t>(elements) * dtype_size(dtype) / sizeof(std::uint64_t) + 1);
    view = TensorView::contiguous(storage.data(), dtype, {1, rows, nheads, dim});
  }
};

// Positions [span.first, span.end) of a cache, gathered.
void gather(const KvCacheProblem& kp, const KvCacheArgs& a, const TensorView& cache, std::int64_t b,
            const CacheSpan& span, Owned& dst) {
  std::vector<float> row(static_cast<std::size_t>(cache.shape[3]));
  for (std::int64_t pos = span.first; pos < span.end; ++pos) {
    for (std::int64_t h = 0; h < cache.shape[2]; ++h) {
      const std::int64_t src = cache_offset(kp, a, cache, b, pos, h);
      for (std::int64_t d = 0; d < cache.shape[3]; ++d)
        row[static_cast<std::size_t>(d)] = numeric::load_as_float(cache.data, src + d, cache.dtype);
      store_row(dst.view.data, (pos - span.first) * dst.view.stride[1] + h * dst.view.stride[2], cache.dtype, row);
    }
  }
}

// Sequence b's queries rotated: row i at span.rotary_pos + i when the queries are the
// new tokens (causal or windowed), all at span.rotary_pos otherwise.
void rotate_queries(const KvCacheProblem& kp, const KvCacheArgs& a, std::int64_t b, const CacheSpan& span, Owned& dst) {
  const Problem& p = kp.attention;
  const bool per_row = p.causal || p.has_window();
  std::vector<float> row(static_cast<std::size_t>(p.head_dim));
  for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
    for (std::int64_t h = 0; h < p.nheads_q; ++h) {
      load_row(a.q, b, i, h, row);
      apply_rotary(row.data(), kp.rotary_dim, a.rotary_cos, a.rotary_sin, span.rotary_pos + (per_row ? i : 0),
                   a.rotary_interleaved);
      store_row(dst.view.data, i * dst.view.stride[1] + h * dst.view.stride[2], a.q.dtype, row);
    }
  }
}

// Batch entry b of a (batch, ...) view as a batch of 1 (an undefined view stays so).
TensorView batch_entry(const TensorView& t, std::int64_t b) {
  if (!t.defined()) return t;
  TensorView one = t;
  one.data = static_cast<std::byte*>(t.data) + b * t.stride[0] * static_cast<std::int64_t>(dtype_size(t.dtype));
  one.shape[0] = 1;
  return one;
}

}  // namespace

CacheSpan cache_span(const KvCacheProblem& kp, const KvCacheArgs& a, std::int64_t b) {
  CacheSpan s;
  s.appended = entry(a.cache_seqlens, b);
  s.first = a.cache_leftpad.defined() ? entry(a.cache_leftpad, b) : 0;
  s.end = s.appended + kp.seqlen_new;
  s.rotary_pos = a.rotary_seqlens.defined() ? entry(a.rotary_seqlens, b) : s.appended;
  return s;
}

void apply_rotary(float* x, std::int64_t rotary_dim, const TensorView& cos, const TensorView& sin, std::int64_t pos,
                  bool interleaved) {
  const std::int64_t half = rotary_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const float c = numeric::load_as_float(cos.data, pos * cos.stride[0] + i * cos.stride[1], cos.dtype);
    const float s = numeric::load_as_float(sin.data, pos * sin.stride[0] + i * sin.stride[1], sin.dtype);
    float& x0 = x[interleaved ? 2 * i : i];
    float& x1 = x[interleaved ? 2 * i + 1 : i + half];
    const float r0 = x0 * c - x1 * s;
    const float r1 = x0 * s + x1 * c;
    x0 = r0;
    x1 = r1;
  }
}

void kvcache_forward(const KvCacheProblem& kp, const KvCacheArgs& a, const TiledCpuConfig& config) {
  const Problem& whole = kp.attention;
  std::vector<Owned> buffers;
  buffers.reserve(static_cast<std::size_t>(3 * whole.batch));
  std::vector<TiledTask> tasks;
  for (std::int64_t b = 0; b < whole.batch; ++b) {
    const CacheSpan span = cache_span(kp, a, b);
    if (kp.seqlen_new > 0) append(kp, a, b, span);
    Owned& k = buffers.emplace_back(a.k_cache.dtype, span.seqlen_k(), whole.nheads_kv, whole.head_dim);
    Owned& v = buffers.emplace_back(a.v_cache.dtype, span.seqlen_k(), whole.nheads_kv, whole.head_dim_v);
    gather(kp, a, a.k_cache, b, span, k);
    gather(kp, a, a.v_cache, b, span, v);
    TiledTask task;
    task.problem = whole;
    task.problem.batch = 1;
    task.problem.seqlen_k = span.seqlen_k();
    task.args.q = batch_entry(a.q, b);
    if (kp.rotary_dim > 0) {
      Owned& q = buffers.emplace_back(a.q.dtype, whole.seqlen_q, whole.nheads_q, whole.head_dim);
      rotate_queries(kp, a, b, span, q);
      task.args.q = q.view;
    }
    task.args.k = k.view;
    task.args.v = v.view;
    task.args.out = batch_entry(a.out, b);
    if (a.lse.defined()) task.args.lse = batch_entry(a.lse, b);
    task.args.sinks = a.sinks;
    task.args.options = a.options;
    // e4m3 inputs: the sequence's row of each descale (batch, nheads_kv).
    task.args.fp8.q_descale = batch_entry(a.fp8.q_descale, b);
    task.args.fp8.k_descale = batch_entry(a.fp8.k_descale, b);
    task.args.fp8.v_descale = batch_entry(a.fp8.v_descale, b);
    tasks.push_back(task);
  }
  tiled_forward(tasks, config);
}

}  // namespace fa3::reference
