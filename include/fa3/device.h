// fa3 — what was built, and what GPU (if any) is present.
#pragma once

#include <string>
#include <vector>

namespace fa3 {

struct BuildInfo {
  std::string version;             // "0.1.0"
  std::string cuda_version;        // toolkit the library was compiled with, "13.0"
  std::string cutlass_version;     // "4.2.0"
  std::vector<int> head_dims;      // head dims with compiled GPU kernels
  std::vector<std::string> dtypes; // dtypes with compiled GPU kernels ("fp16", "bf16")
  bool gpu_kernels = false;        // false when built without any Hopper kernel
  bool gpu_varlen = false;         // varlen calls run on the GPU kernels (FA3_GPU_VARLEN)
  std::vector<int> gpu_varlen_backward_head_dims;  // kernel head dims of their backward (FA3_BWD_VARLEN_HEAD_DIMS)
  bool gpu_kvcache = false;        // forward_with_kvcache runs on the GPU (FA3_GPU_KVCACHE)
  bool gpu_fp8 = false;            // e4m3 forward calls run on the FP8 GPU kernels (FA3_GPU_FP8)
  bool gpu_fp8_varlen = false;     // and varlen ones with e4m3 inputs too (FA3_GPU_FP8_VARLEN)
  bool gpu_fp8_kvcache = false;    // forward_with_kvcache on e4m3 caches too (FA3_GPU_FP8_KVCACHE)
  bool gpu_fp8_vt_smem = false;    // the FP8 kernels transpose V in shared memory: no workspace (FA3_FP8_VT_SMEM)
  bool gpu_kvcache_cluster_merge = false;  // KV-cache splits (2-8) merge in one cluster (FA3_KVCACHE_CLUSTER_MERGE)
};

const BuildInfo& build_info();

struct DeviceInfo {
  bool present = false;     // a CUDA device could be queried
  int index = -1;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  long long global_memory_bytes = 0;
  int l2_bytes = 0;
  int max_smem_per_block_optin = 0;
  std::string error;        // why no device is present, when present == false

  bool is_hopper() const { return present && cc_major == 9 && cc_minor == 0; }
};

// Properties of the current CUDA device; never throws, never aborts without a GPU.
DeviceInfo current_device();

}  // namespace fa3
