#include "hopper/bwd_dispatch.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hopper/bwd_config.h"
#include "hopper/varlen_rows.h"

namespace fa3::hopper {

// One launcher per compiled (dtype, head dim, mask, varlen or not), defined in generated
// files; `variant` is the name's suffix of the varlen instance.
#define FA3_BWD_INSTANCE(dtype, hdim, mask, variant, varlen) \
  Status bwd_##dtype##_hdim##hdim##_##mask##variant(const BwdParams&, cudaStream_t);
#include "bwd_registry.inc"
#undef FA3_BWD_INSTANCE

const std::vector<BwdKernelEntry>& bwd_kernels() {
  static const std::vector<BwdKernelEntry> kernels = {
#define FA3_BWD_INSTANCE(dtype, hdim, mask, variant, varlen)                                             \
  {std::string(#dtype) == "fp16" ? DType::kFloat16 : DType::kBFloat16, hdim, mask_kind_from_name(#mask), \
   varlen, &bwd_##dtype##_hdim##hdim##_##mask##variant},
#include "bwd_registry.inc"
#undef FA3_BWD_INSTANCE
  };
  return kernels;
}

std::vector<DType> bwd_dtypes() {
  std::vector<DType> out;
  for (const BwdKernelEntry& k : bwd_kernels()) {
    if (std::find(out.begin(), out.end(), k.dtype) == out.end()) out.push_back(k.dtype);
  }
  return out;
}

std::vector<int> bwd_head_dims() {
  std::vector<int> out;
  for (const BwdKernelEntry& k : bwd_kernels()) {
    if (std::find(out.begin(), out.end(), k.head_dim) == out.end()) out.push_back(k.head_dim);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int bwd_kernel_head_dim(std::int64_t d) {
  for (int built : bwd_head_dims()) {
    if (built >= d) return built;
  }
  return 0;
}

int bwd_problem_head_dim(const Problem& p) {
  return bwd_kernel_head_dim(std::max(p.head_dim, p.head_dim_v));
}

BwdWorkspace bwd_workspace(const Problem& p, bool deterministic) {
  // The accumulators hold the kernel's head dim: its blocks are the MMA's tiles.
  const int head_dim = bwd_problem_head_dim(p);
  const BwdConfig cfg = bwd_config(head_dim);
  const BwdShape shape{p.batch,  p.seqlen_q, p.seqlen_k, p.nheads_q, p.nheads_kv,
                       head_dim, p.varlen,   p.total_q,  p.total_k};
  return bwd_workspace_layout(shape, cfg.block_m, cfg.block_n, deterministic);
}

bool bwd_varlen_enabled() { return kVarlenKernels; }

std::vector<int> bwd_varlen_head_dims() {
  std::vector<int> out;
  for (const BwdKernelEntry& k : bwd_kernels()) {
    if (k.varlen && std::find(out.begin(), out.end(), k.head_dim) == out.end()) out.push_back(k.head_dim);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool bwd_runs_varlen(int head_dim) {
  const std::vector<int> dims = bwd_varlen_head_dims();
  return std::find(dims.begin(), dims.end(), head_dim) != dims.end();
}

namespace {

// The built kernel of (dtype, head dim, mask, varlen or not), or null.
const BwdKernelEntry* find_bwd_kernel(DType dtype, int head_dim, MaskKind mask, bool varlen) {
  for (const BwdKernelEntry& k : bwd_kernels()) {
    if (k.dtype == dtype && k.head_dim == head_dim && k.mask == mask && k.varlen == varlen) return &k;
  }
  return nullptr;
}

}  // namespace

MaskKind bwd_mask_kind(const Problem& p, DType dtype) {
  const MaskKind kind = mask_kind(p);
  if (!p.varlen || kind == MaskKind::kGeneral) return kind;
  return find_bwd_kernel(dtype, bwd_problem_head_dim(p), kind, true) != nullptr ? kind : MaskKind::kGeneral;
}

BwdParams make_bwd_params(const Problem& p, const BackwardArgs& a, int num_sms) {
  BwdParams b;
  b.q = a.q.data;
  b.k = a.k.data;
  b.v = a.v.data;
  b.out = a.out.data;
  b.dout = a.dout.data;
  b.lse = static_cast<const float*>(a.lse.data);
  b.dq = a.dq.data;
  b.dk = a.dk.data;
  b.dv = a.dv.data;
  b.sinks = static_cast<const float*>(a.sinks.data);
  b.dsinks = static_cast<float*>(a.dsinks.data);
  b.sinks_stride = a.sinks.data != nullptr ? a.sinks.stride[0] : 0;
  b.dsinks_stride = a.dsinks.data != nullptr ? a.dsinks.stride[0] : 0;
  const auto strides = [](const TensorView& t, std::int64_t* batch, std::int64_t* row, std::int64_t* head) {
    *batch = t.stride[0];
    *row = t.stride[1];
    *head = t.stride[2];
  };
  // A varlen call's packed tensors: (total, nheads, dim) and lse (nheads, total), no batch
  // stride (the kernels see one batch entry of all the rows).
  const auto packed_strides = [](const TensorView& t, std::int64_t* batch, std::int64_t* row, std::int64_t* head) {
    *batch = 0;
    *row = t.stride[0];
    *head = t.stride[1];
  };
  const auto set = [&](const TensorView& t, std::int64_t* batch, std::int64_t* row, std::int64_t* head) {
    if (p.varlen) {
      packed_strides(t, batch, row, head);
    } else {
      strides(t, batch, row, head);
    }
  };
  set(a.q, &b.q_batch_stride, &b.q_row_stride, &b.q_head_stride);
  set(a.k, &b.k_batch_stride, &b.k_row_stride, &b.k_head_stride);
  set(a.v, &b.v_batch_stride, &b.v_row_stride, &b.v_head_stride);
  set(a.out, &b.o_batch_stride, &b.o_row_stride, &b.o_head_stride);
  set(a.dout, &b.do_batch_stride, &b.do_row_stride, &b.do_head_stride);
  set(a.dq, &b.dq_batch_stride, &b.dq_row_stride, &b.dq_head_stride);
  set(a.dk, &b.dk_batch_stride, &b.dk_row_stride, &b.dk_head_stride);
  set(a.dv, &b.dv_batch_stride, &b.dv_row_stride, &b.dv_head_stride);
  if (p.varlen) {
    b.lse_head_stride = a.lse.stride[0];
    b.lse_row_stride = a.lse.stride[1];
    b.cu_seqlens_q = static_cast<const int*>(a.varlen.cu_seqlens_q.data);
    b.cu_seqlens_k = static_cast<const int*>(a.varlen.cu_seqlens_k.data);
    b.seqused_q = static_cast<const int*>(a.varlen.seqused_q.data);
    b.seqused_k = static_cast<const int*>(a.varlen.seqused_k.data);
    b.total_q = static_cast<int>(p.total_q);
    b.total_k = static_cast<int>(p.total_k);
  } else {
    b.lse_batch_stride = a.lse.stride[0];
    b.lse_head_stride = a.lse.stride[1];
    b.lse_row_stride = a.lse.stride[2];
  }
  b.batch = static_cast<int>(p.batch);
  b.seqlen_q = static_cast<int>(p.seqlen_q);
  b.seqlen_k = static_cast<int>(p.seqlen_k);
  b.nheads_q = static_cast<int>(p.nheads_q);
  b.nheads_kv = static_cast<int>(p.nheads_kv);
  b.head_dim = static_cast<int>(p.head_dim);
  b.head_dim_v = static_cast<int>(p.head_dim_v);
  b.softmax_scale = p.softmax_scale;
  b.softmax_scale_log2 = p.softmax_scale * static_cast<float>(M_LOG2E);
  b.softcap = p.softcap;
  set_mask_params(p, &b);
  b.deterministic = a.deterministic;
  b.workspace = a.workspace;
  b.layout = bwd_workspace(p, a.deterministic);
  b.num_sms = num_sms;
  return b;
}

Status run_backward(const Problem& p, const BackwardArgs& a, int num_sms, cudaStream_t stream) {
  const int head_dim = bwd_problem_head_dim(p);
  const MaskKind mask = bwd_mask_kind(p, a.q.dtype);
  if (p.varlen && !bwd_runs_varlen(head_dim)) {
    std::string dims;
    for (int d : bwd_varlen_head_dims()) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    return {StatusCode::kNotSupported, "cu_seqlens_q: varlen backward calls run on the GPU at kernel head dims {" +
                                           dims + "} only (FA3_BWD_VARLEN_HEAD_DIMS); this call's kernel head dim is " +
                                           std::to_string(head_dim) + " (fa3::cpu runs it)"};
  }
  if (const BwdKernelEntry* k = find_bwd_kernel(a.q.dtype, head_dim, mask, p.varlen)) {
    const BwdParams params = make_bwd_params(p, a, num_sms);
    const Status launched = k->launch(params, stream);
    if (!launched.is_ok()) return launched;
    // A varlen call's rows of no sequence (hopper/varlen_rows.h); nothing otherwise.
    return launch_clear_unused_grad_rows(params, static_cast<int>(dtype_size(a.dq.dtype)), stream);
  }
  const std::string dims = p.head_dim_v == p.head_dim
                               ? std::to_string(p.head_dim)
                               : std::to_string(p.head_dim) + " (v: " + std::to_string(p.head_dim_v) + ")";
  return {StatusCode::kNotSupported, std::string("no backward kernel was built for dtype ") + dtype_name(a.q.dtype) +
                                         ", head dim " + dims + ", mask " + mask_kind_name(mask) +
                                         (p.varlen ? " (varlen)" : "")};
}

}  // namespace fa3::hopper
