#include <cuda_runtime_api.h>

#include <string>

#include "api/device_cache.h"
#include "api/validate.h"
#include "api/validate_kvcache.h"
#include "common/status_macros.h"
#include "fa3/device.h"
#include "hopper/bwd_dispatch.h"
#include "hopper/fwd_dispatch.h"
#include "hopper/kvcache.h"
#include "hopper/merge.h"

namespace fa3 {

std::string locate_device_pointer(const void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return "not a CUDA pointer";
  }
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return "unusable: no current CUDA device";
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      if (attr.device == dev) return "";
      return "memory of CUDA device " + std::to_string(attr.device) + " (current device is " +
             std::to_string(dev) + ")";
    case cudaMemoryTypeHost: return "pinned host memory";
    default: return "host memory";
  }
}

ValidationTarget gpu_target() {
  ValidationTarget t;
  t.space = ValidationTarget::Space::kDevice;
  t.dtypes = hopper::fwd_dtypes();
  t.head_dims = hopper::fwd_head_dims();
  // Windows, chunks and the softcap run on the general kernels (hopper/mask_kind.h), sinks
  // on every kernel; a build without the kernels a call needs says so when it is dispatched.
  t.supports_window = true;
  t.supports_softcap = true;
  t.supports_sinks = true;
  t.supports_chunk = true;
  // A separate V head dim runs on the forward kernels built for one (FA3_HEAD_DIM_PAIRS);
  // a pair without one is refused when dispatched, naming both head dims. One wider than
  // every kernel's, up to 512 (DeepSeek's (64, 512)), runs in column slices of V.
  t.separate_head_dim_v = true;
  t.max_head_dim_v = 512;
  // Varlen forward calls run on the forward kernels once the build switches them on
  // (hopper::fwd_varlen_enabled); until then they are refused after validation.
  t.supports_varlen = hopper::fwd_varlen_enabled();
  // e4m3 calls run on the FP8 forward kernels once the build switches them on
  // (hopper::fwd_fp8_enabled); until then they are refused after every other rule. The
  // kernels read one block scale per 128-row tile (fa3/attention.h's Fp8Args).
  t.supports_fp8 = hopper::fwd_fp8_enabled();
  t.fp8_block_rows = hopper::kFp8BlockRows;
  t.fp8_head_dims = hopper::fwd_fp8_head_dims();
  // And varlen e4m3 calls where the build switches them on (hopper::fwd_fp8_varlen_enabled).
  t.supports_fp8_varlen = hopper::fwd_fp8_varlen_enabled();
  t.fp8_v_by_tma = hopper::fwd_fp8_vt_in_smem();
  t.locate = locate_device_pointer;
  t.forward_workspace = hopper::fwd_workspace_bytes;
  // forward_with_kvcache runs on its own kernels once the build switches them on
  // (hopper::kvcache_enabled); its workspace follows from the plan for this device.
  t.supports_kvcache = hopper::kvcache_enabled();
  t.supports_fp8_kvcache = hopper::kvcache_fp8_enabled();
  t.kvcache_workspace = [](const KvCacheProblem& p, DType dtype, int num_splits, std::size_t* bytes) {
    const DeviceInfo* dev = nullptr;
    FA3_RETURN_IF_ERROR(current_device_cached(&dev));
    hopper::KvCachePlan plan;
    FA3_RETURN_IF_ERROR(hopper::plan_kvcache(p, dtype, num_splits, p.attention.usable_sms(dev->sm_count), &plan));
    *bytes = plan.bytes;
    return Status::ok();
  };
  return t;
}

ValidationTarget gpu_kvcache_target() {
  ValidationTarget t = gpu_target();
  t.dtypes = hopper::kvcache_dtypes();
  t.head_dims = hopper::kvcache_head_dims();
  return t;
}

ValidationTarget gpu_shape_target() {
  ValidationTarget t = gpu_target();
  t.locate = nullptr;
  t.forward_workspace = nullptr;
  return t;
}

ValidationTarget gpu_backward_target() {
  ValidationTarget t = gpu_target();
  t.dtypes = hopper::bwd_dtypes();
  t.head_dims = hopper::bwd_head_dims();
  // A separate V head dim runs on the kernel of the larger head dim, the narrower
  // tensors' extra columns read as zeros and never written (hopper/bwd_dispatch.cpp).
  t.separate_head_dim_v = true;
  t.max_head_dim_v = t.head_dims.empty() ? 0 : t.head_dims.back();
  // Varlen backward calls run on the backward kernels that carry the varlen paths (the
  // general ones of the head dims in FA3_BWD_VARLEN_HEAD_DIMS), in a build with them
  // (hopper::bwd_varlen_enabled); the dispatcher refuses those of other head dims
  // (kNotSupported naming cu_seqlens_q).
  t.supports_varlen = hopper::bwd_varlen_enabled();
  t.backward_workspace = [](const Problem& p, bool deterministic) {
    return hopper::bwd_workspace(p, deterministic).bytes;
  };
  return t;
}

ValidationTarget gpu_merge_target() {
  ValidationTarget t;
  t.space = ValidationTarget::Space::kDevice;
  t.locate = locate_device_pointer;
  t.max_merge_parts = hopper::kMaxMergeParts;
  return t;
}

ValidationTarget cpu_target() {
  ValidationTarget t;
  t.space = ValidationTarget::Space::kHost;
  t.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  t.max_head_dim = 256;
  t.max_head_dim_v = 512;
  t.separate_head_dim_v = true;
  t.supports_window = true;
  t.supports_softcap = true;
  t.supports_sinks = true;
  t.supports_chunk = true;
  t.supports_varlen = true;
  t.supports_fp8 = true;
  t.supports_fp8_varlen = true;
  t.supports_fp8_kvcache = true;
  return t;
}

}  // namespace fa3
