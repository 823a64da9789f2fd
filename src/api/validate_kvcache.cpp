#include "api/validate_kvcache.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "api/validate_messages.h"
#include "common/status_macros.h"

namespace fa3 {
namespace {

using detail::cat;
using detail::invalid;
using detail::shape_string;
using detail::unsupported;

bool on_host(const ValidationTarget& target) { return target.space == ValidationTarget::Space::kHost; }

const std::int32_t* values(const TensorView& t) { return static_cast<const std::int32_t*>(t.data); }

// A tensor of `rank` dimensions, each >= 1, its last contiguous unless `any_stride`
// (tensors read one element at a time); `described` names the dimensions.
Status check_shape_basics(const char* name, const TensorView& t, int rank, const char* described,
                          bool any_stride = false) {
  const std::string n = name;
  if (t.data == nullptr) return invalid(n + ": data pointer is null");
  if (t.rank != rank) return invalid(cat(n, ": expected a ", rank, "-d tensor ", described, ", got rank ", t.rank));
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] < 1) return invalid(cat(n, ": shape ", shape_string(t), " has an empty dimension"));
    if (t.stride[d] < 0) return invalid(cat(n, ": stride of dim ", d, " must be >= 0, got ", t.stride[d]));
  }
  if (!any_stride && t.stride[rank - 1] != 1 && t.shape[rank - 1] > 1) {
    return invalid(cat(n, ": last dimension must be contiguous (stride 1), got stride ", t.stride[rank - 1]));
  }
  return Status::ok();
}

Status check_dtype(const char* name, const TensorView& t, DType want, const char* whose) {
  if (t.dtype == want) return Status::ok();
  return invalid(cat(name, ": dtype ", dtype_name(t.dtype), " does not match ", whose, " ", dtype_name(want)));
}

// On a device target, where a tensor lives: memory of the current device.
Status check_located(const char* name, const TensorView& t, const ValidationTarget& target) {
  if (on_host(target) || !t.defined() || !target.locate) return Status::ok();
  const std::string where = target.locate(t.data);
  if (where.empty()) return Status::ok();
  return invalid(std::string(name) + ": pointer is " + where + ", not memory of the current CUDA device");
}

// An int32 index tensor of `batch` elements, contiguous (batch) or (batch, columns).
Status check_index(const char* name, const TensorView& t, int rank, std::int64_t batch) {
  FA3_RETURN_IF_ERROR(check_shape_basics(name, t, rank, rank == 1 ? "(batch)" : "(batch, max_pages_per_seq)"));
  if (t.dtype != DType::kInt32) return invalid(cat(name, ": dtype must be int32, got ", dtype_name(t.dtype)));
  if (t.shape[0] != batch)
    return invalid(cat(name, ": shape ", shape_string(t), " must have q's batch ", batch, " first"));
  if (rank == 1 && batch > 1 && t.stride[0] != 1) return invalid(cat(name, ": must be contiguous (stride 1)"));
  return Status::ok();
}

// k_cache and v_cache alone and against each other; fills the cache's layout in `kp`.
Status check_caches(const KvCacheArgs& a, KvCacheProblem* kp) {
  const bool paged = a.page_table.defined();
  const char* layout =
      paged ? "(num_pages, page_size, nheads_kv, head_dim)" : "(batch_cache, seqlen_cache, nheads_kv, head_dim)";
  FA3_RETURN_IF_ERROR(check_shape_basics("k_cache", a.k_cache, 4, layout));
  FA3_RETURN_IF_ERROR(check_shape_basics("v_cache", a.v_cache, 4, layout));
  FA3_RETURN_IF_ERROR(check_dtype("k_cache", a.k_cache, a.q.dtype, "q's dtype"));
  FA3_RETURN_IF_ERROR(check_dtype("v_cache", a.v_cache, a.q.dtype, "q's dtype"));
  for (int d = 0; d < 3; ++d) {
    if (a.v_cache.shape[d] != a.k_cache.shape[d]) {
      return invalid("v_cache: shape " + shape_string(a.v_cache) + " must match k_cache's shape " +
                     shape_string(a.k_cache) + " except in the last dimension");
    }
  }
  if (a.q.rank == 4) {
    if (a.k_cache.shape[3] != a.q.shape[3]) {
      return invalid(cat("k_cache: head dim ", a.k_cache.shape[3], " does not match q's head dim ", a.q.shape[3]));
    }
    if (a.q.shape[2] % a.k_cache.shape[2] != 0) {
      return invalid(cat("q: nheads ", a.q.shape[2], " is not a multiple of k_cache's nheads ", a.k_cache.shape[2]));
    }
  }
  kp->paged = paged;
  kp->page_size = paged ? a.k_cache.shape[1] : 0;
  return Status::ok();
}

// The fixed-length call that has the KV-cache call's q, out, lse, sinks and options, its
// k and v standing for one cache row of each sequence: validate_forward applies its rules
// to them. Nothing is read through the stand-ins (batch stride 0).
ForwardArgs stand_in(const KvCacheArgs& a) {
  ForwardArgs f;
  f.q = a.q;
  f.out = a.out;
  f.lse = a.lse;
  f.sinks = a.sinks;
  f.fp8 = a.fp8;
  f.options = a.options;
  f.k = a.k_cache;
  f.v = a.v_cache;
  for (TensorView* t : {&f.k, &f.v}) {
    t->shape[0] = a.q.rank == 4 ? a.q.shape[0] : 1;
    t->stride[0] = 0;
    t->shape[1] = 1;
  }
  return f;
}

Status check_new_kv(const KvCacheArgs& a, const Problem& p, KvCacheProblem* kp) {
  if (a.k_new.defined() != a.v_new.defined()) {
    return invalid(a.k_new.defined() ? "v_new: must be given with k_new" : "k_new: must be given with v_new");
  }
  if (!a.k_new.defined()) return Status::ok();
  FA3_RETURN_IF_ERROR(check_shape_basics("k_new", a.k_new, 4, "(batch, seqlen_new, nheads_kv, head_dim)"));
  FA3_RETURN_IF_ERROR(check_shape_basics("v_new", a.v_new, 4, "(batch, seqlen_new, nheads_kv, head_dim_v)"));
  FA3_RETURN_IF_ERROR(check_dtype("k_new", a.k_new, a.q.dtype, "q's dtype"));
  FA3_RETURN_IF_ERROR(check_dtype("v_new", a.v_new, a.q.dtype, "q's dtype"));
  const std::int64_t s = a.k_new.shape[1];
  const TensorView* ts[] = {&a.k_new, &a.v_new};
  const char* names[] = {"k_new", "v_new"};
  const std::int64_t dims[] = {p.head_dim, p.head_dim_v};
  for (int i = 0; i < 2; ++i) {
    const TensorView& t = *ts[i];
    if (t.shape[0] != p.batch || t.shape[1] != s || t.shape[2] != p.nheads_kv || t.shape[3] != dims[i]) {
      return invalid(cat(names[i], ": shape ", shape_string(t), " must be (batch, seqlen_new, nheads_kv, ",
                         i == 0 ? "head_dim" : "head_dim_v", ") = (", p.batch, ", ", s, ", ", p.nheads_kv, ", ",
                         dims[i], ")"));
    }
  }
  kp->seqlen_new = s;
  return Status::ok();
}

Status check_rotary(const KvCacheArgs& a, const Problem& p, KvCacheProblem* kp) {
  const bool cos = a.rotary_cos.defined();
  if (cos != a.rotary_sin.defined()) {
    return invalid(cos ? "rotary_sin: must be given with rotary_cos" : "rotary_cos: must be given with rotary_sin");
  }
  if (!cos) {
    if (a.rotary_seqlens.defined()) return invalid("rotary_seqlens: given without rotary_cos and rotary_sin");
    return Status::ok();
  }
  if (!a.k_new.defined()) return invalid("rotary_cos: a rotary embedding needs k_new and v_new to append");
  if (a.q.dtype == DType::kFloat8E4M3) {
    return invalid("rotary_cos: a rotary embedding of e4m3 inputs is not supported; rotate before quantizing");
  }
  FA3_RETURN_IF_ERROR(check_shape_basics("rotary_cos", a.rotary_cos, 2, "(seqlen_ro, rotary_dim / 2)"));
  FA3_RETURN_IF_ERROR(check_shape_basics("rotary_sin", a.rotary_sin, 2, "(seqlen_ro, rotary_dim / 2)"));
  FA3_RETURN_IF_ERROR(check_dtype("rotary_cos", a.rotary_cos, a.q.dtype, "q's dtype"));
  FA3_RETURN_IF_ERROR(check_dtype("rotary_sin", a.rotary_sin, a.q.dtype, "q's dtype"));
  if (a.rotary_sin.shape[0] != a.rotary_cos.shape[0] || a.rotary_sin.shape[1] != a.rotary_cos.shape[1]) {
    return invalid("rotary_sin: shape " + shape_string(a.rotary_sin) + " must equal rotary_cos's shape " +
                   shape_string(a.rotary_cos));
  }
  const std::int64_t rotary_dim = 2 * a.rotary_cos.shape[1];
  if (rotary_dim > p.head_dim) {
    return invalid(cat("rotary_cos: rotary_dim 2 * ", a.rotary_cos.shape[1], " = ", rotary_dim,
                       " exceeds q's head dim ", p.head_dim));
  }
  if (a.rotary_seqlens.defined()) FA3_RETURN_IF_ERROR(check_index("rotary_seqlens", a.rotary_seqlens, 1, p.batch));
  kp->rotary_dim = rotary_dim;
  return Status::ok();
}

// The index tensors' values (host only): lengths within the cache, rows and pages within
// the cache's, rotary positions within the tables.
Status check_values(const KvCacheArgs& a, const KvCacheProblem& kp) {
  const Problem& p = kp.attention;
  const std::int32_t* seqlens = values(a.cache_seqlens);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t len = seqlens[b];
    if (len < 0) return invalid(cat("cache_seqlens: cache_seqlens[", b, "] = ", len, " must be >= 0"));
    if (len + kp.seqlen_new > kp.capacity) {
      return invalid(cat("cache_seqlens: cache_seqlens[", b, "] + seqlen_new = ", len, " + ", kp.seqlen_new,
                         " exceeds the cache's ", kp.capacity, " positions per sequence"));
    }
    const std::int64_t left = a.cache_leftpad.defined() ? values(a.cache_leftpad)[b] : 0;
    if (left < 0 || left > len) {
      return invalid(
          cat("cache_leftpad: cache_leftpad[", b, "] = ", left, " is outside [0, cache_seqlens[", b, "] = ", len, "]"));
    }
    if (a.cache_batch_idx.defined()) {
      const std::int64_t row = values(a.cache_batch_idx)[b];
      if (row < 0 || row >= a.k_cache.shape[0]) {
        return invalid(cat("cache_batch_idx: cache_batch_idx[", b, "] = ", row, " is outside [0, ", a.k_cache.shape[0],
                           "), k_cache's rows"));
      }
    }
    if (kp.paged) {
      const std::int64_t end = len + kp.seqlen_new;
      for (std::int64_t page = left / kp.page_size; page * kp.page_size < end; ++page) {
        const std::int64_t id = values(a.page_table)[b * a.page_table.stride[0] + page];
        if (id < 0 || id >= a.k_cache.shape[0]) {
          return invalid(cat("page_table: page_table[", b, "][", page, "] = ", id, " is outside [0, ",
                             a.k_cache.shape[0], "), k_cache's pages"));
        }
      }
    }
    if (kp.rotary_dim > 0) {
      const std::int64_t pos = a.rotary_seqlens.defined() ? values(a.rotary_seqlens)[b] : len;
      const std::int64_t q_rows = (p.causal || p.has_window()) ? p.seqlen_q : 1;
      const std::int64_t last = pos + std::max(q_rows, kp.seqlen_new) - 1;
      if (pos < 0) return invalid(cat("rotary_seqlens: rotary_seqlens[", b, "] = ", pos, " must be >= 0"));
      if (last >= a.rotary_cos.shape[0]) {
        return invalid(cat("rotary_cos: position ", last, " of sequence ", b, " is past its ", a.rotary_cos.shape[0],
                           " rows (seqlen_ro)"));
      }
    }
  }
  return Status::ok();
}


}  // namespace

Status validate_kvcache(const KvCacheArgs& a, const ValidationTarget& target, KvCacheProblem* problem) {
  KvCacheProblem kp;
  FA3_RETURN_IF_ERROR(check_caches(a, &kp));
  FA3_RETURN_IF_ERROR(check_located("k_cache", a.k_cache, target));
  FA3_RETURN_IF_ERROR(check_located("v_cache", a.v_cache, target));
  // validate_forward's rules for e4m3 inputs apply (the dtypes, the descales' shapes);
  // whether this target runs them is said below, and a KV-cache call's workspace is its own.
  const std::pair<const char*, const TensorView*> block_scales[] = {
      {"q_block_scale", &a.fp8.q_block_scale}, {"k_block_scale", &a.fp8.k_block_scale},
      {"v_block_scale", &a.fp8.v_block_scale}};
  for (const auto& [name, view] : block_scales) {
    if (view->defined()) {
      return invalid(std::string(name) + ": block scales are not supported in KV-cache calls; give q/k/v_descale");
    }
  }
  ValidationTarget attention_target = target;
  attention_target.supports_fp8 = true;
  attention_target.forward_workspace = nullptr;
  FA3_RETURN_IF_ERROR(validate_forward(stand_in(a), attention_target, &kp.attention));
  kp.out_dtype = a.out.dtype;
  Problem& p = kp.attention;
  FA3_RETURN_IF_ERROR(check_index("cache_seqlens", a.cache_seqlens, 1, p.batch));
  if (kp.paged) {
    FA3_RETURN_IF_ERROR(check_index("page_table", a.page_table, 2, p.batch));
    if (a.cache_batch_idx.defined()) {
      return invalid("cache_batch_idx: not supported with a paged cache (page_table); order the page table instead");
    }
    kp.capacity = a.page_table.shape[1] * kp.page_size;
  } else {
    kp.capacity = a.k_cache.shape[1];
    if (a.cache_batch_idx.defined()) {
      FA3_RETURN_IF_ERROR(check_index("cache_batch_idx", a.cache_batch_idx, 1, p.batch));
    } else if (a.k_cache.shape[0] != p.batch) {
      return invalid(cat("k_cache: batch_cache ", a.k_cache.shape[0], " must equal q's batch ", p.batch,
                         " when cache_batch_idx is not given"));
    }
  }
  if (a.cache_leftpad.defined()) FA3_RETURN_IF_ERROR(check_index("cache_leftpad", a.cache_leftpad, 1, p.batch));
  FA3_RETURN_IF_ERROR(check_new_kv(a, p, &kp));
  FA3_RETURN_IF_ERROR(check_rotary(a, p, &kp));
  const char* names[] = {"cache_seqlens", "page_table", "cache_batch_idx", "cache_leftpad", "k_new",
                         "v_new",         "rotary_cos", "rotary_sin",      "rotary_seqlens"};
  const TensorView* views[] = {&a.cache_seqlens, &a.page_table, &a.cache_batch_idx, &a.cache_leftpad, &a.k_new,
                               &a.v_new,         &a.rotary_cos, &a.rotary_sin,      &a.rotary_seqlens};
  for (int i = 0; i < 9; ++i) FA3_RETURN_IF_ERROR(check_located(names[i], *views[i], target));
  if (a.num_splits < 0) return invalid(cat("num_splits must be >= 0 (0: chosen by a heuristic), got ", a.num_splits));
  if (!on_host(target)) {
    if (!target.supports_kvcache) {
      return unsupported("k_cache: KV-cache attention is not implemented on the GPU yet");
    }
    if (a.q.dtype == DType::kFloat8E4M3 && !target.supports_fp8_kvcache) {
      return unsupported(
          "q: e4m3 (FP8) KV-cache calls are not supported on the GPU yet (fa3::cpu::forward_with_kvcache runs them)");
    }
    // The index tensors are device memory: the kernels read them, unchecked.
    if (target.kvcache_workspace) {
      std::size_t needed = 0;
      FA3_RETURN_IF_ERROR(target.kvcache_workspace(kp, a.q.dtype, a.num_splits, &needed));
      // A call that needs none (one split, no rotary embedding) takes a null workspace.
      FA3_RETURN_IF_ERROR(
          check_caller_workspace(a.workspace, a.workspace_bytes, needed, "fa3::kvcache_workspace_size", target));
    }
    *problem = kp;
    return Status::ok();
  }
  FA3_RETURN_IF_ERROR(check_values(a, kp));
  *problem = kp;
  return Status::ok();
}

Status validate_combine(const CombineArgs& a, const ValidationTarget& target, CombineProblem* problem) {
  FA3_RETURN_IF_ERROR(check_shape_basics("out_partial", a.out_partial, 4, "(num_splits, rows, nheads, head_dim)"));
  FA3_RETURN_IF_ERROR(check_shape_basics("lse_partial", a.lse_partial, 3, "(num_splits, rows, nheads)", true));
  FA3_RETURN_IF_ERROR(check_shape_basics("out", a.out, 3, "(rows, nheads, head_dim)"));
  if (a.lse.defined()) FA3_RETURN_IF_ERROR(check_shape_basics("lse", a.lse, 2, "(rows, nheads)", true));
  FA3_RETURN_IF_ERROR(check_dtype("out_partial", a.out_partial, DType::kFloat32, "the required"));
  FA3_RETURN_IF_ERROR(check_dtype("lse_partial", a.lse_partial, DType::kFloat32, "the required"));
  if (a.lse.defined()) FA3_RETURN_IF_ERROR(check_dtype("lse", a.lse, DType::kFloat32, "the required"));
  if (a.out.dtype != DType::kFloat32 && a.out.dtype != DType::kFloat16 && a.out.dtype != DType::kBFloat16) {
    return invalid(cat("out: dtype must be fp32, fp16 or bf16, got ", dtype_name(a.out.dtype)));
  }
  const TensorView& op = a.out_partial;
  for (int d = 0; d < 3; ++d) {
    if (a.lse_partial.shape[d] != op.shape[d]) {
      return invalid(cat("lse_partial: shape ", shape_string(a.lse_partial), " must be (num_splits, rows, nheads) = (",
                         op.shape[0], ", ", op.shape[1], ", ", op.shape[2], "), as out_partial's"));
    }
  }
  if (a.out.shape[0] != op.shape[1] || a.out.shape[1] != op.shape[2] || a.out.shape[2] != op.shape[3]) {
    return invalid(cat("out: shape ", shape_string(a.out), " must be (rows, nheads, head_dim) = (", op.shape[1], ", ",
                       op.shape[2], ", ", op.shape[3], ")"));
  }
  if (a.lse.defined() && (a.lse.shape[0] != op.shape[1] || a.lse.shape[1] != op.shape[2])) {
    return invalid(
        cat("lse: shape ", shape_string(a.lse), " must be (rows, nheads) = (", op.shape[1], ", ", op.shape[2], ")"));
  }
  FA3_RETURN_IF_ERROR(check_located("out_partial", a.out_partial, target));
  FA3_RETURN_IF_ERROR(check_located("lse_partial", a.lse_partial, target));
  FA3_RETURN_IF_ERROR(check_located("out", a.out, target));
  FA3_RETURN_IF_ERROR(check_located("lse", a.lse, target));
  *problem = {op.shape[0], op.shape[1], op.shape[2], op.shape[3]};
  return Status::ok();
}

}  // namespace fa3
