#include "api/validate_varlen.h"

#include <cstdint>
#include <string>

#include "api/validate_messages.h"
#include "common/status_macros.h"

namespace fa3 {
namespace {

using detail::cat;
using detail::invalid;
using detail::shape_string;
using detail::unsupported;

// One int32 index tensor of `length` elements (`what` describes the length for the
// message): rank 1, int32, contiguous, and on a device target aligned and in the
// current device's memory.
Status check_index_tensor(const char* name, const TensorView& t, std::int64_t length, const char* what,
                          const ValidationTarget& target) {
  const std::string n = name;
  if (t.rank != 1) return invalid(cat(n, ": expected a 1-d tensor (", what, "), got rank ", t.rank));
  if (t.dtype != DType::kInt32) return invalid(n + ": dtype must be int32, got " + dtype_name(t.dtype));
  if (t.shape[0] != length)
    return invalid(cat(n, ": shape ", shape_string(t), " must be (", what, ") = (", length, ")"));
  if (length > 1 && t.stride[0] != 1) {
    return invalid(cat(n, ": must be contiguous (stride 1), got stride ", t.stride[0]));
  }
  if (target.space == ValidationTarget::Space::kDevice) {
    if (reinterpret_cast<std::uintptr_t>(t.data) % sizeof(std::int32_t) != 0) {
      return invalid(n + ": data pointer is not aligned to its element size");
    }
    if (target.locate) {
      const std::string where = target.locate(t.data);
      if (!where.empty()) return invalid(n + ": pointer is " + where + ", not memory of the current CUDA device");
    }
  }
  return Status::ok();
}

const std::int32_t* values(const TensorView& t) { return static_cast<const std::int32_t*>(t.data); }

// cu_seqlens (host): 0 first, non-decreasing, the last at most the tensors' total rows.
Status check_offsets(const char* name, const TensorView& cu, std::int64_t total, const char* rows_of) {
  const std::string n = name;
  const std::int32_t* cu_values = values(cu);
  if (cu_values[0] != 0) return invalid(cat(n, ": ", n, "[0] must be 0, got ", cu_values[0]));
  const std::int64_t batch = cu.shape[0] - 1;
  for (std::int64_t b = 1; b <= batch; ++b) {
    if (cu_values[b] < cu_values[b - 1]) {
      return invalid(cat(n, ": ", n, "[", b, "] = ", cu_values[b], " is less than ", n, "[", b - 1,
                         "] = ", cu_values[b - 1], " (must be non-decreasing)"));
    }
  }
  if (cu_values[batch] > total) {
    return invalid(
        cat(n, ": ", n, "[", batch, "] = ", cu_values[batch], " exceeds ", rows_of, "'s total rows, ", total));
  }
  return Status::ok();
}

// seqused (host): each sequence's used rows within its length in cu_seqlens.
Status check_used(const char* name, const TensorView& used, const char* cu_name, const TensorView& cu) {
  const std::string n = name;
  const std::int32_t* cu_values = values(cu);
  for (std::int64_t b = 0; b + 1 < cu.shape[0]; ++b) {
    const std::int64_t length = std::int64_t{cu_values[b + 1]} - cu_values[b];
    const std::int32_t u = values(used)[b];
    if (u < 0 || u > length) {
      return invalid(
          cat(n, ": ", n, "[", b, "] = ", u, " is outside [0, ", length, "], sequence ", b, "'s length in ", cu_name));
    }
  }
  return Status::ok();
}

// max_seqlen (host): at least the longest sequence, after seqused.
Status check_max_seqlen(const char* name, int max_seqlen, const char* side, const TensorView& cu,
                        const TensorView& used) {
  const std::int32_t* cu_values = values(cu);
  std::int64_t longest = 0, which = 0;
  for (std::int64_t b = 0; b + 1 < cu.shape[0]; ++b) {
    const std::int64_t length = used.defined() ? values(used)[b] : std::int64_t{cu_values[b + 1]} - cu_values[b];
    if (length > longest) {
      longest = length;
      which = b;
    }
  }
  if (max_seqlen >= longest) return Status::ok();
  const std::string sequence = *side != '\0' ? std::string(side) + " sequence" : std::string("sequence");
  return invalid(
      cat(name, ": ", max_seqlen, " is less than the longest ", sequence, ", ", longest, " (sequence ", which, ")"));
}

}  // namespace

Status check_varlen_absent(const VarlenArgs& v) {
  const char* needs = " given without cu_seqlens_q (it belongs to a varlen call)";
  if (v.cu_seqlens_k.defined()) return invalid(std::string("cu_seqlens_k:") + needs);
  if (v.seqused_q.defined()) return invalid(std::string("seqused_q:") + needs);
  if (v.seqused_k.defined()) return invalid(std::string("seqused_k:") + needs);
  if (v.max_seqlen_q != 0) return invalid(cat("max_seqlen_q: ", v.max_seqlen_q, needs, "; leave it 0"));
  if (v.max_seqlen_k != 0) return invalid(cat("max_seqlen_k: ", v.max_seqlen_k, needs, "; leave it 0"));
  return Status::ok();
}

Status check_packed_qkv_shapes(const TensorView& q, const TensorView& k, const TensorView& v, Problem* p) {
  if (k.shape[2] != q.shape[2]) {
    return invalid(cat("k: head dim ", k.shape[2], " does not match q's head dim ", q.shape[2]));
  }
  if (v.shape[0] != k.shape[0] || v.shape[1] != k.shape[1]) {
    return invalid("v: shape " + shape_string(v) + " must match k's shape " + shape_string(k) + " in total and nheads");
  }
  if (q.shape[1] % k.shape[1] != 0) {
    return invalid(cat("q: nheads ", q.shape[1], " is not a multiple of k's nheads ", k.shape[1]));
  }
  p->total_q = q.shape[0];
  p->total_k = k.shape[0];
  p->nheads_q = q.shape[1];
  p->nheads_kv = k.shape[1];
  p->head_dim = q.shape[2];
  p->head_dim_v = v.shape[2];
  return Status::ok();
}

Status check_packed_out_shape(const char* name, const TensorView& t, const Problem& p) {
  if (t.shape[0] == p.total_q && t.shape[1] == p.nheads_q && t.shape[2] == p.head_dim_v) return Status::ok();
  return invalid(cat(name, ": shape ", shape_string(t), " must be (total_q, nheads_q, head_dim_v) = (", p.total_q, ", ",
                     p.nheads_q, ", ", p.head_dim_v, ")"));
}

Status check_packed_lse_shape(const TensorView& lse, const Problem& p) {
  if (lse.shape[0] == p.nheads_q && lse.shape[1] == p.total_q) return Status::ok();
  return invalid(
      cat("lse: shape ", shape_string(lse), " must be (nheads_q, total_q) = (", p.nheads_q, ", ", p.total_q, ")"));
}

Status check_varlen_indices(const VarlenArgs& v, const ValidationTarget& target, Problem* p) {
  if (!v.cu_seqlens_k.defined()) {
    return invalid("cu_seqlens_k: data pointer is null; a varlen call needs it with cu_seqlens_q");
  }
  const TensorView& cu_q = v.cu_seqlens_q;
  if (cu_q.rank != 1) return invalid(cat("cu_seqlens_q: expected a 1-d tensor (batch + 1), got rank ", cu_q.rank));
  if (cu_q.shape[0] < 2) {
    return invalid(cat("cu_seqlens_q: shape ", shape_string(cu_q), " must be (batch + 1) with batch >= 1"));
  }
  const std::int64_t batch = cu_q.shape[0] - 1;
  FA3_RETURN_IF_ERROR(check_index_tensor("cu_seqlens_q", cu_q, batch + 1, "batch + 1", target));
  FA3_RETURN_IF_ERROR(check_index_tensor("cu_seqlens_k", v.cu_seqlens_k, batch + 1, "batch + 1", target));
  if (v.seqused_q.defined()) FA3_RETURN_IF_ERROR(check_index_tensor("seqused_q", v.seqused_q, batch, "batch", target));
  if (v.seqused_k.defined()) FA3_RETURN_IF_ERROR(check_index_tensor("seqused_k", v.seqused_k, batch, "batch", target));
  if (v.max_seqlen_q < 0) return invalid(cat("max_seqlen_q must be >= 0, got ", v.max_seqlen_q));
  if (v.max_seqlen_k < 0) return invalid(cat("max_seqlen_k must be >= 0, got ", v.max_seqlen_k));

  // The values are read where they live; device memory is the kernels' to read.
  if (target.space == ValidationTarget::Space::kHost) {
    FA3_RETURN_IF_ERROR(check_offsets("cu_seqlens_q", cu_q, p->total_q, "q"));
    FA3_RETURN_IF_ERROR(check_offsets("cu_seqlens_k", v.cu_seqlens_k, p->total_k, "k"));
    if (v.seqused_q.defined()) FA3_RETURN_IF_ERROR(check_used("seqused_q", v.seqused_q, "cu_seqlens_q", cu_q));
    if (v.seqused_k.defined()) {
      FA3_RETURN_IF_ERROR(check_used("seqused_k", v.seqused_k, "cu_seqlens_k", v.cu_seqlens_k));
    }
    FA3_RETURN_IF_ERROR(check_max_seqlen("max_seqlen_q", v.max_seqlen_q, "query", cu_q, v.seqused_q));
    FA3_RETURN_IF_ERROR(check_max_seqlen("max_seqlen_k", v.max_seqlen_k, "key", v.cu_seqlens_k, v.seqused_k));
  }
  p->varlen = true;
  p->batch = batch;
  p->seqlen_q = v.max_seqlen_q;
  p->seqlen_k = v.max_seqlen_k;
  return Status::ok();
}

Status check_sequence_offsets(const char* name, const TensorView& cu, int max_seqlen, std::int64_t total,
                              const char* rows_of, const ValidationTarget& target) {
  const std::string n = name;
  if (cu.data == nullptr) return invalid(n + ": data pointer is null");
  if (cu.rank != 1) return invalid(cat(n, ": expected a 1-d tensor (batch + 1), got rank ", cu.rank));
  if (cu.shape[0] < 2) return invalid(cat(n, ": shape ", shape_string(cu), " must be (batch + 1) with batch >= 1"));
  FA3_RETURN_IF_ERROR(check_index_tensor(name, cu, cu.shape[0], "batch + 1", target));
  if (max_seqlen < 0) return invalid(cat("max_seqlen must be >= 0, got ", max_seqlen));
  if (target.space == ValidationTarget::Space::kHost) {
    FA3_RETURN_IF_ERROR(check_offsets(name, cu, total, rows_of));
    FA3_RETURN_IF_ERROR(check_max_seqlen("max_seqlen", max_seqlen, "", cu, TensorView{}));
  }
  return Status::ok();
}

Status check_varlen_supported(const ValidationTarget& target) {
  if (target.supports_varlen) return Status::ok();
  return unsupported(std::string("cu_seqlens_q: variable-length batches (varlen) are not implemented") +
                     (target.space == ValidationTarget::Space::kDevice ? " on the GPU" : " on this path") + " yet");
}

}  // namespace fa3
