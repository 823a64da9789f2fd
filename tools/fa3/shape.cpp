#include "shape.h"

#include <algorithm>
#include <initializer_list>
#include <sstream>

#include "errors.h"

namespace fa3::cli {

namespace {

std::int64_t checked_product(std::initializer_list<std::int64_t> sizes) {
  std::int64_t n = 1;
  for (std::int64_t s : sizes) {
    if (__builtin_mul_overflow(n, s, &n)) throw RunError("the tensors of this shape have more than 2^63 elements");
  }
  return n;
}

}  // namespace

std::int64_t AttentionShape::q_elements() const { return checked_product({batch, seqlen_q, nheads_q, head_dim}); }
std::int64_t AttentionShape::kv_elements() const { return checked_product({batch, seqlen_k, nheads_kv, head_dim}); }
std::int64_t AttentionShape::v_elements() const { return checked_product({batch, seqlen_k, nheads_kv, value_dim()}); }
std::int64_t AttentionShape::out_elements() const { return checked_product({batch, seqlen_q, nheads_q, value_dim()}); }
std::int64_t AttentionShape::lse_elements() const { return checked_product({batch, nheads_q, seqlen_q}); }

std::string AttentionShape::describe() const {
  std::ostringstream s;
  s << "batch " << batch << ", seqlen_q " << seqlen_q << ", seqlen_k " << seqlen_k << ", nheads " << nheads_q << " (kv "
    << nheads_kv << "), head dim " << head_dim;
  if (value_dim() != head_dim) s << " (v " << value_dim() << ")";
  s << ", " << dtype_name(dtype);
  if (options.causal) s << ", causal";
  if (options.window_left >= 0 || options.window_right >= 0) {
    s << ", window (" << options.window_left << ", " << options.window_right << ")";
  }
  if (options.softcap > 0.f) s << ", softcap " << options.softcap;
  if (options.attention_chunk > 0) s << ", chunk " << options.attention_chunk;
  if (options.softmax_scale > 0.f) s << ", scale " << options.softmax_scale;
  if (!sinks.empty()) {
    const bool same = std::all_of(sinks.begin(), sinks.end(), [&](float x) { return x == sinks.front(); });
    s << ", sinks ";
    if (same) {
      s << sinks.front();
    } else {
      for (std::size_t h = 0; h < sinks.size(); ++h) s << (h ? ", " : "(") << sinks[h];
      s << ")";
    }
  }
  return s.str();
}

ForwardArgs forward_args(const AttentionShape& shape, const TensorPointers& ptrs) {
  const AttentionShape& s = shape;
  ForwardArgs a;
  a.q = TensorView::contiguous(ptrs.q, s.dtype, {s.batch, s.seqlen_q, s.nheads_q, s.head_dim});
  a.k = TensorView::contiguous(ptrs.k, s.dtype, {s.batch, s.seqlen_k, s.nheads_kv, s.head_dim});
  a.v = TensorView::contiguous(ptrs.v, s.dtype, {s.batch, s.seqlen_k, s.nheads_kv, s.value_dim()});
  a.out = TensorView::contiguous(ptrs.out, output_dtype(s.dtype), {s.batch, s.seqlen_q, s.nheads_q, s.value_dim()});
  a.lse = TensorView::contiguous(ptrs.lse, DType::kFloat32, {s.batch, s.nheads_q, s.seqlen_q});
  if (ptrs.sinks != nullptr) a.sinks = TensorView::contiguous(ptrs.sinks, DType::kFloat32, {s.nheads_q});
  a.options = s.options;
  return a;
}

BackwardArgs backward_args(const AttentionShape& shape, const TensorPointers& ptrs, const GradientPointers& grads,
                           bool deterministic) {
  const AttentionShape& s = shape;
  const ForwardArgs f = forward_args(shape, ptrs);
  BackwardArgs a;
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.out = f.out;
  a.lse = f.lse;
  a.sinks = f.sinks;
  a.dout = TensorView::contiguous(grads.dout, s.dtype, {s.batch, s.seqlen_q, s.nheads_q, s.value_dim()});
  a.dq = TensorView::contiguous(grads.dq, s.dtype, {s.batch, s.seqlen_q, s.nheads_q, s.head_dim});
  a.dk = TensorView::contiguous(grads.dk, s.dtype, {s.batch, s.seqlen_k, s.nheads_kv, s.head_dim});
  a.dv = TensorView::contiguous(grads.dv, s.dtype, {s.batch, s.seqlen_k, s.nheads_kv, s.value_dim()});
  a.options = s.options;
  a.deterministic = deterministic;
  return a;
}

void TensorCapacity::grow_to(const AttentionShape& shape) {
  q_elements = std::max(q_elements, shape.q_elements());
  kv_elements = std::max(kv_elements, shape.kv_elements());
  v_elements = std::max(v_elements, shape.v_elements());
  out_elements = std::max(out_elements, shape.out_elements());
  lse_elements = std::max(lse_elements, shape.lse_elements());
}

}  // namespace fa3::cli
