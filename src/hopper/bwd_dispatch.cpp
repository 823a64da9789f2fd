#include "hopper/bwd_dispatch.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hopper/bwd_config.h"

namespace fa3::hopper {

// One launcher per compiled (dtype, head dim, mask), defined in generated files.
#define FA3_BWD_INSTANCE(dtype, hdim, mask) \
  Status bwd_##dtype##_hdim##hdim##_##mask(const BwdParams&, cudaStream_t);
#include "bwd_registry.inc"
#undef FA3_BWD_INSTANCE

const std::vector<BwdKernelEntry>& bwd_kernels() {
  static const std::vector<BwdKernelEntry> kernels = {
#define FA3_BWD_INSTANCE(dtype, hdim, mask)                                                              \
  {std::string(#dtype) == "fp16" ? DType::kFloat16 : DType::kBFloat16, hdim, mask_kind_from_name(#mask), \
   &bwd_##dtype##_hdim##hdim##_##mask},
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
  const BwdShape shape{p.batch, p.seqlen_q, p.seqlen_k, p.nheads_q, p.nheads_kv, head_dim};
  return bwd_workspace_layout(shape, cfg.block_m, cfg.block_n, deterministic);
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
  strides(a.q, &b.q_batch_stride, &b.q_row_stride, &b.q_head_stride);
  strides(a.k, &b.k_batch_stride, &b.k_row_stride, &b.k_head_stride);
  strides(a.v, &b.v_batch_stride, &b.v_row_stride, &b.v_head_stride);
  strides(a.out, &b.o_batch_stride, &b.o_row_stride, &b.o_head_stride);
  strides(a.dout, &b.do_batch_stride, &b.do_row_stride, &b.do_head_stride);
  strides(a.dq, &b.dq_batch_stride, &b.dq_row_stride, &b.dq_head_stride);
  strides(a.dk, &b.dk_batch_stride, &b.dk_row_stride, &b.dk_head_stride);
  strides(a.dv, &b.dv_batch_stride, &b.dv_row_stride, &b.dv_head_stride);
  b.lse_batch_stride = a.lse.stride[0];
  b.lse_head_stride = a.lse.stride[1];
  b.lse_row_stride = a.lse.stride[2];
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
  const MaskKind mask = mask_kind(p);
  const int head_dim = bwd_problem_head_dim(p);
  for (const BwdKernelEntry& k : bwd_kernels()) {
    if (k.dtype == a.q.dtype && k.head_dim == head_dim && k.mask == mask) {
      return k.launch(make_bwd_params(p, a, num_sms), stream);
    }
  }
  const std::string dims = p.head_dim_v == p.head_dim
                               ? std::to_string(p.head_dim)
                               : std::to_string(p.head_dim) + " (v: " + std::to_string(p.head_dim_v) + ")";
  return {StatusCode::kNotSupported, std::string("no backward kernel was built for dtype ") + dtype_name(a.q.dtype) +
                                         ", head dim " + dims + ", mask " + mask_kind_name(mask)};
}

}  // namespace fa3::hopper
