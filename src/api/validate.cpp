#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "api/validate_fp8.h"
#include "api/validate_messages.h"
#include "api/validate_varlen.h"
#include "common/status_macros.h"

namespace fa3 {
namespace {

constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();
// TMA tensor maps hold global strides below 2^40 bytes.
constexpr std::int64_t kMaxTmaStrideBytes = std::int64_t{1} << 40;

// The role a tensor plays fixes its rank and the names of its dimensions: rows of
// attention (q, k, v, out and the gradients) or lse, in the padded (batch, seqlen, ...)
// layout or in the packed (total, ...) layout of a varlen call.
enum class Role { kRows, kLse, kPackedRows, kPackedLse };

struct RoleLayout {
  int rank;
  const char* dims[4];
  const char* described;
};

const RoleLayout& layout_of(Role role) {
  static const RoleLayout kLayouts[] = {
      {4, {"batch", "seqlen", "nheads", "head_dim"}, "(batch, seqlen, nheads, head_dim)"},
      {3, {"batch", "nheads", "seqlen"}, "(batch, nheads, seqlen)"},
      {3, {"total", "nheads", "head_dim"}, "(total, nheads, head_dim)"},
      {2, {"nheads", "total"}, "(nheads, total)"},
  };
  return kLayouts[static_cast<int>(role)];
}

bool is_lse(Role role) { return role == Role::kLse || role == Role::kPackedLse; }

// The head dim of a rows tensor of either layout: its last dimension.
std::int64_t head_dim_of(const TensorView& t) { return t.shape[t.rank - 1]; }

using detail::cat;
using detail::invalid;
using detail::shape_string;
using detail::str;
using detail::unsupported;

std::string join(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + str(v[i]);
  return s;
}

std::string join(const std::vector<DType>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += std::string(i ? ", " : "") + dtype_name(v[i]);
  return s;
}

// Rules that concern one tensor alone: presence, rank, sizes, strides. `keys_contiguous`
// also admits a rows tensor whose rows (keys), not its last dimension, are contiguous:
// an e4m3 v laid out for FP8 wgmma (FlashAttention-3's V_colmajor).
Status check_tensor(const char* name, const TensorView& t, Role role, bool keys_contiguous = false) {
  const std::string n = name;
  const RoleLayout& layout = layout_of(role);
  if (t.data == nullptr) return invalid(n + ": data pointer is null");
  if (t.rank != layout.rank) {
    return invalid(cat(n, ": expected a ", layout.rank, "-d tensor ", layout.described, ", got rank ", t.rank));
  }
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 1) {
      return invalid(cat(n, ": ", layout.dims[d], " must be >= 1, got ", t.shape[d]));
    }
    if (t.shape[d] > kMaxInt32) {
      return invalid(cat(n, ": ", layout.dims[d], " ", t.shape[d], " is out of range (max ", kMaxInt32, ")"));
    }
    if (t.stride[d] < 0) {
      return invalid(cat(n, ": stride of dim ", d, " (", layout.dims[d], ") must be >= 0, got ", t.stride[d]));
    }
  }
  if (!is_lse(role) && t.stride[t.rank - 1] != 1) {
    if (keys_contiguous && t.stride[t.rank - 3] == 1) return Status::ok();
    return invalid(cat(n, ": last dimension must be contiguous (stride 1), got stride ", t.stride[t.rank - 1],
                       keys_contiguous ? " (an e4m3 v may have its seqlen dimension contiguous instead)" : ""));
  }
  return Status::ok();
}

Status check_same_dtype(const char* name, const TensorView& t, const TensorView& q) {
  if (t.dtype == q.dtype) return Status::ok();
  return invalid(std::string(name) + ": dtype " + dtype_name(t.dtype) + " does not match q's dtype " +
                 dtype_name(q.dtype));
}

Status check_lse_dtype(const TensorView& lse) {
  if (lse.dtype == DType::kFloat32) return Status::ok();
  return invalid(std::string("lse: dtype must be fp32, got ") + dtype_name(lse.dtype));
}

Status check_same_shape(const char* name, const TensorView& t, const char* ref_name, const TensorView& ref) {
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] != ref.shape[d]) {
      return invalid(std::string(name) + ": shape " + shape_string(t) + " must equal " + ref_name + "'s shape " +
                     shape_string(ref));
    }
  }
  return Status::ok();
}

// q, k, v (and their gradients' shapes) against each other; fills the sizes of `p`.
Status check_qkv_shapes(const TensorView& q, const TensorView& k, const TensorView& v, Problem* p) {
  if (k.shape[0] != q.shape[0]) {
    return invalid(cat("k: batch ", k.shape[0], " does not match q's batch ", q.shape[0]));
  }
  if (k.shape[3] != q.shape[3]) {
    return invalid(cat("k: head dim ", k.shape[3], " does not match q's head dim ", q.shape[3]));
  }
  if (v.shape[0] != k.shape[0] || v.shape[1] != k.shape[1] || v.shape[2] != k.shape[2]) {
    return invalid("v: shape " + shape_string(v) + " must match k's shape " + shape_string(k) +
                   " in batch, seqlen and nheads");
  }
  if (q.shape[2] % k.shape[2] != 0) {
    return invalid(cat("q: nheads ", q.shape[2], " is not a multiple of k's nheads ", k.shape[2]));
  }
  p->batch = q.shape[0];
  p->seqlen_q = q.shape[1];
  p->seqlen_k = k.shape[1];
  p->nheads_q = q.shape[2];
  p->nheads_kv = k.shape[2];
  p->head_dim = q.shape[3];
  p->head_dim_v = v.shape[3];
  return Status::ok();
}

// out and dout: q's batch, seqlen and heads, with v's head dim.
Status check_out_shape(const char* name, const TensorView& t, const Problem& p) {
  if (t.shape[0] == p.batch && t.shape[1] == p.seqlen_q && t.shape[2] == p.nheads_q && t.shape[3] == p.head_dim_v) {
    return Status::ok();
  }
  return invalid(cat(name, ": shape ", shape_string(t), " must be (batch, seqlen_q, nheads_q, head_dim_v) = (", p.batch,
                     ", ", p.seqlen_q, ", ", p.nheads_q, ", ", p.head_dim_v, ")"));
}

Status check_lse_shape(const TensorView& lse, const Problem& p) {
  if (lse.shape[0] == p.batch && lse.shape[1] == p.nheads_q && lse.shape[2] == p.seqlen_q) return Status::ok();
  return invalid(cat("lse: shape ", shape_string(lse), " must be (batch, nheads_q, seqlen_q) = (", p.batch, ", ",
                     p.nheads_q, ", ", p.seqlen_q, ")"));
}

// sinks and dsinks: one fp32 value per query head, at any (non-negative) stride.
Status check_head_vector(const char* name, const TensorView& t, const Problem& p) {
  const std::string n = name;
  if (t.rank != 1) return invalid(cat(n, ": expected a 1-d tensor (nheads_q), got rank ", t.rank));
  if (t.dtype != DType::kFloat32) return invalid(n + ": dtype must be fp32, got " + dtype_name(t.dtype));
  if (t.shape[0] != p.nheads_q) {
    return invalid(cat(n, ": shape ", shape_string(t), " must be (nheads_q) = (", p.nheads_q, ")"));
  }
  if (t.stride[0] < 0) return invalid(cat(n, ": stride must be >= 0, got ", t.stride[0]));
  return Status::ok();
}

// A target without sinks refuses them after every rule on the arguments themselves, so
// that a call that is wrong anyway says what is wrong.
Status check_sinks_supported(const ValidationTarget& target) {
  if (target.supports_sinks) return Status::ok();
  return unsupported(std::string("sinks: attention sinks are not implemented") +
                     (target.space == ValidationTarget::Space::kDevice ? " on the GPU" : " on this path") + " yet");
}

// `fp8_forward`: e4m3 inputs of a forward call, which check_fp8_supported refuses (or
// not) after every other rule instead.
Status check_dtype_and_head_dims(const TensorView& q, const TensorView& v, const ValidationTarget& target,
                                 bool fp8_forward = false) {
  // `dtypes` lists the 16-bit kernels' inputs; a build of FP8 kernels alone runs e4m3 calls.
  if (target.dtypes.empty() && !(fp8_forward && target.supports_fp8)) {
    return unsupported("no GPU kernels were built into this library");
  }
  if (!fp8_forward && std::find(target.dtypes.begin(), target.dtypes.end(), q.dtype) == target.dtypes.end()) {
    return unsupported(std::string("q: dtype ") + dtype_name(q.dtype) + " is not supported" +
                       (target.space == ValidationTarget::Space::kDevice ? " on the GPU" : " on the CPU path") +
                       "; supported: " + join(target.dtypes));
  }
  const std::int64_t d = head_dim_of(q);
  const std::vector<int>& dims =
      fp8_forward && !target.fp8_head_dims.empty() ? target.fp8_head_dims : target.head_dims;
  const bool any = dims.empty();
  const int largest = any ? target.max_head_dim : *std::max_element(dims.begin(), dims.end());
  if (d > largest) {
    const std::string built = any ? "" : " (kernels built for head dims " + join(dims) + ")";
    return unsupported(cat("q: head dim ", d, " is not supported; supported: 1 to ", largest, built));
  }
  if (head_dim_of(v) > target.max_head_dim_v) {
    return unsupported(
        cat("v: head dim ", head_dim_of(v), " is not supported; supported: 1 to ", target.max_head_dim_v));
  }
  if (target.space == ValidationTarget::Space::kDevice) {
    // TMA moves rows in whole 16-byte units, stores included: a row that ends inside
    // one would have the unit's remaining elements written (measured).
    const std::int64_t unit = 16 / static_cast<std::int64_t>(dtype_size(q.dtype));
    for (const auto& [name, dim] : {std::pair{"q", d}, std::pair{"v", head_dim_of(v)}}) {
      if (dim % unit != 0) {
        return unsupported(cat(name, ": head dim ", dim, " is not a multiple of ", unit,
                               " (16 bytes), as the GPU needs; pad it with zero columns (flash_attn_func does)"));
      }
    }
  }
  return Status::ok();
}

// A target that runs v at q's head dim only refuses another after every rule on the
// arguments themselves, as it refuses sinks, so that a call that is wrong anyway says
// what is wrong.
Status check_head_dim_v_supported(const Problem& p, const ValidationTarget& target) {
  if (p.head_dim_v == p.head_dim || target.separate_head_dim_v) return Status::ok();
  return unsupported(cat("v: head dim ", p.head_dim_v, " differs from q's head dim ", p.head_dim,
                         "; a separate V head dim is not implemented",
                         (target.space == ValidationTarget::Space::kDevice ? " on the GPU" : " on this path"), " yet"));
}

// TMA reads whole 16-byte units: base pointers and every non-unit stride must be
// 16-byte multiples (the contiguous dimension is checked already: the last, or for an
// e4m3 v with its keys contiguous the seqlen dimension). `tma_role`: the role of a tensor
// TMA reads (its dims named in the messages); none for one read element-wise.
Status check_device_tensor(const char* name, const TensorView& t, const ValidationTarget& target,
                           std::optional<Role> tma_role) {
  const std::string n = name;
  if (tma_role) {
    if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) {
      return invalid(n + ": data pointer is not 16-byte aligned (TMA needs it)");
    }
    const std::int64_t elems_per_16b = 16 / static_cast<std::int64_t>(dtype_size(t.dtype));
    const int contiguous = t.stride[t.rank - 1] == 1 ? t.rank - 1 : t.rank - 3;
    for (int d = 0; d < t.rank; ++d) {
      if (d == contiguous) continue;
      if (t.stride[d] % elems_per_16b != 0) {
        return invalid(cat(n, ": stride ", t.stride[d], " of dim ", d, " (", layout_of(*tma_role).dims[d],
                           ") is not a multiple of ", elems_per_16b, " elements (16 bytes; TMA needs it)"));
      }
      if (t.stride[d] * static_cast<std::int64_t>(dtype_size(t.dtype)) >= kMaxTmaStrideBytes) {
        return invalid(
            cat(n, ": stride ", t.stride[d], " of dim ", d, " is too large (TMA strides are below 2^40 bytes)"));
      }
    }
  } else if (reinterpret_cast<std::uintptr_t>(t.data) % dtype_size(t.dtype) != 0) {
    return invalid(n + ": data pointer is not aligned to its element size");
  }
  if (target.locate) {
    std::string where = target.locate(t.data);
    if (!where.empty()) return invalid(n + ": pointer is " + where + ", not memory of the current CUDA device");
  }
  return Status::ok();
}

Status check_options(const AttentionOptions& o, const ValidationTarget& target, Problem* p) {
  if (!std::isfinite(o.softmax_scale) || o.softmax_scale < 0.f) {
    return invalid(
        cat("softmax_scale must be finite and > 0 (or 0 for the default 1/sqrt(head_dim)), got ", o.softmax_scale));
  }
  if (o.window_left < -1 || o.window_right < -1) {
    return invalid(cat("window_left and window_right must be >= -1 (-1: unbounded), got (", o.window_left, ", ",
                       o.window_right, ")"));
  }
  if (o.causal && o.window_right > 0) {
    return invalid(cat("window_right ", o.window_right, " conflicts with causal (causal means window_right = 0)"));
  }
  if (!std::isfinite(o.softcap) || o.softcap < 0.f) {
    return invalid(cat("softcap must be finite and >= 0 (0: off), got ", o.softcap));
  }
  const bool window = o.window_left >= 0 || (o.window_right >= 0 && !o.causal);
  if (window && !target.supports_window) {
    return unsupported("sliding window (window_left/window_right) is not implemented on this path yet");
  }
  if (o.softcap > 0.f && !target.supports_softcap) {
    return unsupported("softcap is not implemented on this path yet");
  }
  if (o.attention_chunk < 0) {
    return invalid(cat("attention_chunk must be >= 0 (0: none), got ", o.attention_chunk));
  }
  if (o.attention_chunk > 0 && !target.supports_chunk) {
    return unsupported("attention_chunk: chunked attention is not implemented on this path yet");
  }
  if (o.sm_margin < 0) return invalid(cat("sm_margin must be >= 0 (SMs left free), got ", o.sm_margin));
  p->softmax_scale = o.softmax_scale > 0.f ? o.softmax_scale : 1.f / std::sqrt(static_cast<float>(p->head_dim));
  p->causal = o.causal;
  p->window_left = o.window_left;
  p->window_right = o.causal ? 0 : o.window_right;
  p->softcap = o.softcap;
  p->chunk = o.attention_chunk;
  p->sm_margin = o.sm_margin;
  return Status::ok();
}

// The roles of a call's tensors: padded, or packed for a varlen call.
struct CallLayout {
  bool varlen;
  Role rows;
  Role lse;

  explicit CallLayout(const VarlenArgs& v)
      : varlen(v.enabled()),
        rows(varlen ? Role::kPackedRows : Role::kRows),
        lse(varlen ? Role::kPackedLse : Role::kLse) {}
};

Status check_shapes(const CallLayout& l, const TensorView& q, const TensorView& k, const TensorView& v, Problem* p) {
  return l.varlen ? check_packed_qkv_shapes(q, k, v, p) : check_qkv_shapes(q, k, v, p);
}

Status check_out(const CallLayout& l, const char* name, const TensorView& t, const Problem& p) {
  return l.varlen ? check_packed_out_shape(name, t, p) : check_out_shape(name, t, p);
}

Status check_lse(const CallLayout& l, const TensorView& lse, const Problem& p) {
  return l.varlen ? check_packed_lse_shape(lse, p) : check_lse_shape(lse, p);
}

// The index tensors of a varlen call, once the totals are known; a fixed-length call's
// VarlenArgs were checked to be unset first.
Status check_indices(const CallLayout& l, const VarlenArgs& v, const ValidationTarget& target, Problem* p) {
  return l.varlen ? check_varlen_indices(v, target, p) : Status::ok();
}

}  // namespace

Status validate_forward(const ForwardArgs& a, const ValidationTarget& target, Problem* problem) {
  const bool device = target.space == ValidationTarget::Space::kDevice;
  const bool has_lse = a.lse.data != nullptr;
  const bool has_sinks = a.sinks.data != nullptr;
  const CallLayout layout(a.varlen);
  if (!layout.varlen) FA3_RETURN_IF_ERROR(check_varlen_absent(a.varlen));
  const bool fp8 = a.q.dtype == DType::kFloat8E4M3;
  FA3_RETURN_IF_ERROR(check_tensor("q", a.q, layout.rows));
  FA3_RETURN_IF_ERROR(check_tensor("k", a.k, layout.rows));
  FA3_RETURN_IF_ERROR(check_tensor("v", a.v, layout.rows, fp8));
  FA3_RETURN_IF_ERROR(check_tensor("out", a.out, layout.rows));
  if (has_lse) FA3_RETURN_IF_ERROR(check_tensor("lse", a.lse, layout.lse));

  FA3_RETURN_IF_ERROR(check_dtype_and_head_dims(a.q, a.v, target, fp8));
  FA3_RETURN_IF_ERROR(check_same_dtype("k", a.k, a.q));
  FA3_RETURN_IF_ERROR(check_same_dtype("v", a.v, a.q));
  if (!fp8) FA3_RETURN_IF_ERROR(check_same_dtype("out", a.out, a.q));
  FA3_RETURN_IF_ERROR(check_fp8_dtypes(a));
  if (has_lse) FA3_RETURN_IF_ERROR(check_lse_dtype(a.lse));

  Problem p;
  FA3_RETURN_IF_ERROR(check_shapes(layout, a.q, a.k, a.v, &p));
  FA3_RETURN_IF_ERROR(check_out(layout, "out", a.out, p));
  if (has_lse) FA3_RETURN_IF_ERROR(check_lse(layout, a.lse, p));
  if (has_sinks) FA3_RETURN_IF_ERROR(check_head_vector("sinks", a.sinks, p));
  FA3_RETURN_IF_ERROR(check_indices(layout, a.varlen, target, &p));
  FA3_RETURN_IF_ERROR(check_fp8_scales(a, p, target));

  if (device) {
    FA3_RETURN_IF_ERROR(check_device_tensor("q", a.q, target, layout.rows));
    FA3_RETURN_IF_ERROR(check_device_tensor("k", a.k, target, layout.rows));
    // An e4m3 v is read element-wise (by the transpose into the workspace), unless the
    // kernels transpose it in shared memory, which TMA fills.
    const bool v_by_tma = !fp8 || target.fp8_v_by_tma;
    FA3_RETURN_IF_ERROR(
        check_device_tensor("v", a.v, target, v_by_tma ? std::optional<Role>(layout.rows) : std::nullopt));
    FA3_RETURN_IF_ERROR(check_device_tensor("out", a.out, target, layout.rows));
    if (has_lse) FA3_RETURN_IF_ERROR(check_device_tensor("lse", a.lse, target, std::nullopt));
    if (has_sinks) FA3_RETURN_IF_ERROR(check_device_tensor("sinks", a.sinks, target, std::nullopt));
  }
  FA3_RETURN_IF_ERROR(check_options(a.options, target, &p));
  FA3_RETURN_IF_ERROR(check_head_dim_v_supported(p, target));
  if (has_sinks) FA3_RETURN_IF_ERROR(check_sinks_supported(target));
  if (layout.varlen) FA3_RETURN_IF_ERROR(check_varlen_supported(target));
  FA3_RETURN_IF_ERROR(check_fp8_supported(a, target));
  p.has_sinks = has_sinks;
  p.fp8_block_scales = fp8 && a.fp8.has_block_scales();
  if (device && target.forward_workspace) {
    FA3_RETURN_IF_ERROR(check_caller_workspace(a.workspace, a.workspace_bytes, target.forward_workspace(p, a.q.dtype),
                                               "fa3::forward_workspace_size", target));
  }
  *problem = p;
  return Status::ok();
}

// The caller's scratch memory of a device call: `needed` bytes (0: none, and a null
// pointer is fine), 256-byte aligned, on the current device. `size_query` names the
// function that tells the caller the size.
Status check_caller_workspace(const void* workspace, std::size_t bytes, std::size_t needed, const char* size_query,
                              const ValidationTarget& target) {
  if (needed > 0 && workspace == nullptr) {
    return invalid(cat("workspace: data pointer is null; this call needs ", static_cast<std::int64_t>(needed),
                       " bytes (", size_query, ")"));
  }
  if (bytes < needed) {
    return invalid(cat("workspace: ", static_cast<std::int64_t>(bytes), " bytes given, ",
                       static_cast<std::int64_t>(needed), " needed (", size_query, ")"));
  }
  if (workspace == nullptr) return Status::ok();
  if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) {
    return invalid("workspace: data pointer is not 256-byte aligned");
  }
  if (target.locate) {
    const std::string where = target.locate(workspace);
    if (!where.empty()) return invalid("workspace: pointer is " + where + ", not memory of the current CUDA device");
  }
  return Status::ok();
}

Status validate_backward(const BackwardArgs& a, const ValidationTarget& target, Problem* problem) {
  const bool device = target.space == ValidationTarget::Space::kDevice;
  const bool has_sinks = a.sinks.data != nullptr;
  const bool has_dsinks = a.dsinks.data != nullptr;
  const CallLayout layout(a.varlen);
  if (!layout.varlen) FA3_RETURN_IF_ERROR(check_varlen_absent(a.varlen));
  FA3_RETURN_IF_ERROR(check_tensor("q", a.q, layout.rows));
  FA3_RETURN_IF_ERROR(check_tensor("k", a.k, layout.rows));
  FA3_RETURN_IF_ERROR(check_tensor("v", a.v, layout.rows));
  FA3_RETURN_IF_ERROR(check_tensor("out", a.out, layout.rows));
  FA3_RETURN_IF_ERROR(check_tensor("dout", a.dout, layout.rows));
  FA3_RETURN_IF_ERROR(check_tensor("lse", a.lse, layout.lse));
  FA3_RETURN_IF_ERROR(check_tensor("dq", a.dq, layout.rows));
  FA3_RETURN_IF_ERROR(check_tensor("dk", a.dk, layout.rows));
  FA3_RETURN_IF_ERROR(check_tensor("dv", a.dv, layout.rows));

  FA3_RETURN_IF_ERROR(check_dtype_and_head_dims(a.q, a.v, target));
  FA3_RETURN_IF_ERROR(check_same_dtype("k", a.k, a.q));
  FA3_RETURN_IF_ERROR(check_same_dtype("v", a.v, a.q));
  FA3_RETURN_IF_ERROR(check_same_dtype("out", a.out, a.q));
  FA3_RETURN_IF_ERROR(check_same_dtype("dout", a.dout, a.q));
  FA3_RETURN_IF_ERROR(check_lse_dtype(a.lse));
  FA3_RETURN_IF_ERROR(check_same_dtype("dq", a.dq, a.q));
  FA3_RETURN_IF_ERROR(check_same_dtype("dk", a.dk, a.q));
  FA3_RETURN_IF_ERROR(check_same_dtype("dv", a.dv, a.q));

  Problem p;
  FA3_RETURN_IF_ERROR(check_shapes(layout, a.q, a.k, a.v, &p));
  FA3_RETURN_IF_ERROR(check_out(layout, "out", a.out, p));
  FA3_RETURN_IF_ERROR(check_out(layout, "dout", a.dout, p));
  FA3_RETURN_IF_ERROR(check_lse(layout, a.lse, p));
  FA3_RETURN_IF_ERROR(check_same_shape("dq", a.dq, "q", a.q));
  FA3_RETURN_IF_ERROR(check_same_shape("dk", a.dk, "k", a.k));
  FA3_RETURN_IF_ERROR(check_same_shape("dv", a.dv, "v", a.v));
  if (has_dsinks && !has_sinks) return invalid("dsinks: given without sinks (it is the gradient of sinks)");
  if (has_sinks) FA3_RETURN_IF_ERROR(check_head_vector("sinks", a.sinks, p));
  if (has_dsinks) FA3_RETURN_IF_ERROR(check_head_vector("dsinks", a.dsinks, p));
  FA3_RETURN_IF_ERROR(check_indices(layout, a.varlen, target, &p));

  if (device) {
    const char* names[] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
    const TensorView* views[] = {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv};
    for (int i = 0; i < 8; ++i) {
      FA3_RETURN_IF_ERROR(check_device_tensor(names[i], *views[i], target, layout.rows));
    }
    FA3_RETURN_IF_ERROR(check_device_tensor("lse", a.lse, target, std::nullopt));
    if (has_sinks) FA3_RETURN_IF_ERROR(check_device_tensor("sinks", a.sinks, target, std::nullopt));
    if (has_dsinks) FA3_RETURN_IF_ERROR(check_device_tensor("dsinks", a.dsinks, target, std::nullopt));
  }
  FA3_RETURN_IF_ERROR(check_options(a.options, target, &p));
  FA3_RETURN_IF_ERROR(check_head_dim_v_supported(p, target));
  if (has_sinks) FA3_RETURN_IF_ERROR(check_sinks_supported(target));
  // Before the workspace: a target without varlen refuses the call rather than size a
  // workspace for it.
  if (layout.varlen) FA3_RETURN_IF_ERROR(check_varlen_supported(target));
  p.has_sinks = has_sinks;
  if (device && target.backward_workspace) {
    FA3_RETURN_IF_ERROR(check_caller_workspace(a.workspace, a.workspace_bytes, target.backward_workspace(p, a.deterministic),
                                               "fa3::backward_workspace_size", target));
  }
  *problem = p;
  return Status::ok();
}

}  // namespace fa3
