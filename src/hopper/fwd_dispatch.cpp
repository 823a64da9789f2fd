#include "hopper/fwd_dispatch.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace fa3::hopper {

// One launcher per compiled (dtype, head dim, mask), defined in generated files.
#define FA3_FWD_INSTANCE(dtype, hdim, mask) Status fwd_##dtype##_hdim##hdim##_##mask(const FwdParams&, cudaStream_t);
#include "fwd_registry.inc"
#undef FA3_FWD_INSTANCE

namespace {

DType dtype_from_name(const char* name) {
  return std::string(name) == "fp16" ? DType::kFloat16 : DType::kBFloat16;
}

}  // namespace

std::vector<DType> fwd_dtypes() {
  std::vector<DType> out;
#define FA3_FWD_INSTANCE(dtype, hdim, mask)                                  \
  if (std::find(out.begin(), out.end(), dtype_from_name(#dtype)) == out.end()) \
    out.push_back(dtype_from_name(#dtype));
#include "fwd_registry.inc"
#undef FA3_FWD_INSTANCE
  return out;
}

std::vector<int> fwd_head_dims() {
  std::vector<int> out;
#define FA3_FWD_INSTANCE(dtype, hdim, mask) \
  if (std::find(out.begin(), out.end(), hdim) == out.end()) out.push_back(hdim);
#include "fwd_registry.inc"
#undef FA3_FWD_INSTANCE
  std::sort(out.begin(), out.end());
  return out;
}

FwdParams make_fwd_params(const Problem& p, const ForwardArgs& a, int num_sms) {
  FwdParams f;
  f.q = a.q.data;
  f.k = a.k.data;
  f.v = a.v.data;
  f.out = a.out.data;
  f.lse = static_cast<float*>(a.lse.data);
  f.q_batch_stride = a.q.stride[0];
  f.q_row_stride = a.q.stride[1];
  f.q_head_stride = a.q.stride[2];
  f.k_batch_stride = a.k.stride[0];
  f.k_row_stride = a.k.stride[1];
  f.k_head_stride = a.k.stride[2];
  f.v_batch_stride = a.v.stride[0];
  f.v_row_stride = a.v.stride[1];
  f.v_head_stride = a.v.stride[2];
  f.o_batch_stride = a.out.stride[0];
  f.o_row_stride = a.out.stride[1];
  f.o_head_stride = a.out.stride[2];
  if (a.lse.data != nullptr) {
    f.lse_batch_stride = a.lse.stride[0];
    f.lse_head_stride = a.lse.stride[1];
    f.lse_row_stride = a.lse.stride[2];
  }
  f.batch = static_cast<int>(p.batch);
  f.seqlen_q = static_cast<int>(p.seqlen_q);
  f.seqlen_k = static_cast<int>(p.seqlen_k);
  f.nheads_q = static_cast<int>(p.nheads_q);
  f.nheads_kv = static_cast<int>(p.nheads_kv);
  f.head_dim = static_cast<int>(p.head_dim);
  f.softmax_scale = p.softmax_scale;
  f.softmax_scale_log2 = p.softmax_scale * static_cast<float>(M_LOG2E);
  f.softcap = p.softcap;
  f.window_left = static_cast<int>(p.window_left);
  f.window_right = static_cast<int>(p.window_right);
  f.num_sms = num_sms;
  return f;
}

Status run_forward(const Problem& p, const ForwardArgs& a, int num_sms, cudaStream_t stream) {
  const FwdParams params = make_fwd_params(p, a, num_sms);
  const char* dtype = a.q.dtype == DType::kFloat16 ? "fp16" : "bf16";
  const std::string mask = p.causal ? "causal" : "plain";
#define FA3_FWD_INSTANCE(dt, hdim, msk)                                                   \
  if (std::string(#dt) == dtype && hdim == p.head_dim && std::string(#msk) == mask) \
    return fwd_##dt##_hdim##hdim##_##msk(params, stream);
#include "fwd_registry.inc"
#undef FA3_FWD_INSTANCE
  return {StatusCode::kNotSupported, std::string("no forward kernel was built for dtype ") + dtype + ", head dim " +
                                         std::to_string(p.head_dim) + ", mask " + mask};
}

}  // namespace fa3::hopper
