#include "reference/varlen.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>

#include "common/numeric.h"

namespace fa3::reference {
namespace {

const std::int32_t* int32_values(const TensorView& t) { return static_cast<const std::int32_t*>(t.data); }

// Moves a view's base pointer by `elements` of its dtype.
void advance(TensorView& t, std::int64_t elements) {
  t.data = static_cast<std::byte*>(t.data) + elements * static_cast<std::int64_t>(dtype_size(t.dtype));
}

// The rows [used, end) of each span and [last end, total): the rows of no sequence.
template <class Span>
std::vector<RowRange> unused_rows(const std::vector<Sequence>& seqs, std::int64_t total, Span span) {
  std::vector<RowRange> unused;
  std::int64_t end = 0;
  for (const Sequence& s : seqs) {
    const auto [start, used, stop] = span(s);
    if (start + used < stop) unused.push_back({start + used, stop});
    end = stop;
  }
  if (end < total) unused.push_back({end, total});
  return unused;
}

// Writes `value` to every element of rows [r.begin, r.end) of a packed (total, nheads, dim) view.
void fill_rows(const TensorView& t, const RowRange& r, float value) {
  for (std::int64_t row = r.begin; row < r.end; ++row) {
    for (std::int64_t h = 0; h < t.shape[1]; ++h) {
      const std::int64_t base = row * t.stride[0] + h * t.stride[1];
      for (std::int64_t d = 0; d < t.shape[2]; ++d)
        numeric::store_from_float(t.data, base + d * t.stride[2], t.dtype, value);
    }
  }
}

// Writes `value` to entries [r.begin, r.end) of every head of a packed (nheads, total) lse.
void fill_lse(const TensorView& lse, const RowRange& r, float value) {
  for (std::int64_t h = 0; h < lse.shape[0]; ++h) {
    for (std::int64_t row = r.begin; row < r.end; ++row) {
      static_cast<float*>(lse.data)[h * lse.stride[0] + row * lse.stride[1]] = value;
    }
  }
}

// Copies a sequence's (1, rows, nheads, dim) canonical result to rows [start, ...) of a
// packed canonical (total, nheads, dim) one: the same row-major order, offset.
void place(const std::vector<double>& part, std::int64_t start, std::int64_t row_size, std::vector<double>& whole) {
  std::copy(part.begin(), part.end(), whole.begin() + start * row_size);
}

// A sequence's (1, nheads, rows) canonical lse to entries [start, ...) of each head of a
// packed canonical (nheads, total) one.
void place_lse(const std::vector<double>& part, std::int64_t start, std::int64_t rows, std::int64_t heads,
               std::int64_t total, std::vector<double>& whole) {
  for (std::int64_t h = 0; h < heads; ++h) {
    std::copy(part.begin() + h * rows, part.begin() + (h + 1) * rows, whole.begin() + h * total + start);
  }
}

// Entry b of a view's first (batch) dimension, as a batch of one; an undefined view
// stays undefined.
TensorView batch_entry(const TensorView& t, std::int64_t b) {
  if (!t.defined()) return t;
  TensorView entry = t;
  entry.shape[0] = 1;
  advance(entry, b * t.stride[0]);
  return entry;
}

// The FP8 scales of sequence b: its row of each (batch, ...) scale tensor, whose block
// scales count blocks from the sequence's first row.
Fp8Args sequence_fp8_args(const Fp8Args& f, std::int64_t b) {
  Fp8Args seq = f;
  for (TensorView* t : {&seq.q_descale, &seq.k_descale, &seq.v_descale, &seq.q_block_scale, &seq.k_block_scale,
                        &seq.v_block_scale}) {
    *t = batch_entry(*t, b);
  }
  return seq;
}

ForwardArgs sequence_forward_args(const ForwardArgs& a, const Sequence& s) {
  ForwardArgs seq = a;
  seq.fp8 = sequence_fp8_args(a.fp8, s.index);
  seq.q = rows_view(a.q, s.q_start, s.q_used);
  seq.k = rows_view(a.k, s.k_start, s.k_used);
  seq.v = rows_view(a.v, s.k_start, s.k_used);
  seq.out = rows_view(a.out, s.q_start, s.q_used);
  if (a.lse.defined()) seq.lse = lse_view(a.lse, s.q_start, s.q_used);
  seq.varlen = VarlenArgs{};
  return seq;
}

}  // namespace

std::vector<Sequence> varlen_sequences(const VarlenArgs& v) {
  const std::int32_t* cu_q = int32_values(v.cu_seqlens_q);
  const std::int32_t* cu_k = int32_values(v.cu_seqlens_k);
  const std::int64_t batch = v.cu_seqlens_q.shape[0] - 1;
  std::vector<Sequence> seqs(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    Sequence& s = seqs[static_cast<std::size_t>(b)];
    s.index = b;
    s.q_start = cu_q[b];
    s.q_end = cu_q[b + 1];
    s.q_used = v.seqused_q.defined() ? int32_values(v.seqused_q)[b] : s.q_end - s.q_start;
    s.k_start = cu_k[b];
    s.k_end = cu_k[b + 1];
    s.k_used = v.seqused_k.defined() ? int32_values(v.seqused_k)[b] : s.k_end - s.k_start;
  }
  return seqs;
}

Problem sequence_problem(const Problem& whole, const Sequence& s) {
  Problem p = whole;
  p.varlen = false;
  p.batch = 1;
  p.seqlen_q = s.q_used;
  p.seqlen_k = s.k_used;
  p.total_q = 0;
  p.total_k = 0;
  return p;
}

TensorView rows_view(const TensorView& packed, std::int64_t start, std::int64_t rows) {
  TensorView t;
  t.data = packed.data;
  t.dtype = packed.dtype;
  t.rank = 4;
  const std::int64_t shape[] = {1, rows, packed.shape[1], packed.shape[2]};
  // Batch 1: no index ever steps over the batch stride.
  const std::int64_t stride[] = {0, packed.stride[0], packed.stride[1], packed.stride[2]};
  std::copy(shape, shape + 4, t.shape);
  std::copy(stride, stride + 4, t.stride);
  advance(t, start * packed.stride[0]);
  return t;
}

TensorView lse_view(const TensorView& packed, std::int64_t start, std::int64_t rows) {
  TensorView t;
  t.data = packed.data;
  t.dtype = packed.dtype;
  t.rank = 3;
  const std::int64_t shape[] = {1, packed.shape[0], rows};
  const std::int64_t stride[] = {0, packed.stride[0], packed.stride[1]};
  std::copy(shape, shape + 3, t.shape);
  std::copy(stride, stride + 3, t.stride);
  advance(t, start * packed.stride[1]);
  return t;
}

std::vector<RowRange> unused_query_rows(const std::vector<Sequence>& seqs, std::int64_t total_q) {
  return unused_rows(seqs, total_q, [](const Sequence& s) { return std::array{s.q_start, s.q_used, s.q_end}; });
}

std::vector<RowRange> unused_key_rows(const std::vector<Sequence>& seqs, std::int64_t total_k) {
  return unused_rows(seqs, total_k, [](const Sequence& s) { return std::array{s.k_start, s.k_used, s.k_end}; });
}

void varlen_tiled_forward(const Problem& p, const ForwardArgs& args, const TiledCpuConfig& config) {
  const std::vector<Sequence> seqs = varlen_sequences(args.varlen);
  std::vector<TiledTask> tasks;
  tasks.reserve(seqs.size());
  for (const Sequence& s : seqs) tasks.push_back({sequence_problem(p, s), sequence_forward_args(args, s)});
  tiled_forward(tasks, config);
  for (const RowRange& r : unused_query_rows(seqs, p.total_q)) {
    fill_rows(args.out, r, 0.f);
    if (args.lse.defined()) fill_lse(args.lse, r, -std::numeric_limits<float>::infinity());
  }
}

ForwardResult varlen_forward(const Problem& p, const ForwardArgs& args, Precision precision) {
  ForwardResult whole;
  whole.out.assign(static_cast<std::size_t>(p.total_q * p.nheads_q * p.head_dim_v), 0.0);
  whole.lse.assign(static_cast<std::size_t>(p.nheads_q * p.total_q), -std::numeric_limits<double>::infinity());
  for (const Sequence& s : varlen_sequences(args.varlen)) {
    const ForwardArgs a = sequence_forward_args(args, s);
    const ForwardResult part = forward(sequence_problem(p, s), a.q, a.k, a.v, precision, a.sinks);
    place(part.out, s.q_start, p.nheads_q * p.head_dim_v, whole.out);
    place_lse(part.lse, s.q_start, s.q_used, p.nheads_q, p.total_q, whole.lse);
  }
  return whole;
}

BackwardResult varlen_backward(const Problem& p, const BackwardArgs& args, Precision precision) {
  BackwardResult whole;
  whole.dq.assign(static_cast<std::size_t>(p.total_q * p.nheads_q * p.head_dim), 0.0);
  whole.dk.assign(static_cast<std::size_t>(p.total_k * p.nheads_kv * p.head_dim), 0.0);
  whole.dv.assign(static_cast<std::size_t>(p.total_k * p.nheads_kv * p.head_dim_v), 0.0);
  if (args.sinks.defined()) whole.dsinks.assign(static_cast<std::size_t>(p.nheads_q), 0.0);
  for (const Sequence& s : varlen_sequences(args.varlen)) {
    const TensorView q = rows_view(args.q, s.q_start, s.q_used);
    const TensorView k = rows_view(args.k, s.k_start, s.k_used);
    const TensorView v = rows_view(args.v, s.k_start, s.k_used);
    const TensorView dout = rows_view(args.dout, s.q_start, s.q_used);
    const BackwardResult part = backward(sequence_problem(p, s), q, k, v, dout, precision, args.sinks);
    place(part.dq, s.q_start, p.nheads_q * p.head_dim, whole.dq);
    place(part.dk, s.k_start, p.nheads_kv * p.head_dim, whole.dk);
    place(part.dv, s.k_start, p.nheads_kv * p.head_dim_v, whole.dv);
    for (std::size_t h = 0; h < part.dsinks.size(); ++h) whole.dsinks[h] += part.dsinks[h];
  }
  return whole;
}

}  // namespace fa3::reference
