// fa3 — the compiled forward kernels, and the choice of one for a validated problem.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"
#include "hopper/fwd_config.h"
#include "hopper/fwd_params.h"
#include "hopper/mask_kind.h"

namespace fa3::hopper {

// One compiled forward kernel (from the configure-time kernel list).
struct FwdKernelEntry {
  DType dtype;      // of Q, K and V
  DType out_dtype;  // of O: dtype, or bf16 / fp16 for e4m3 inputs
  int head_dim;     // of Q and K
  int head_dim_v;   // of V and O
  MaskKind mask;
  FwdTile tile;
  Status (*launch)(const FwdParams&, cudaStream_t);

  // The tile, "MxN", with the suffixes of the build's tile list ("-or", "-kv3", "-q1"
  // ...) when it forced a choice: unique among the kernels of one problem kind.
  std::string name() const;
  // Whether an e4m3 kernel can take block scales (Fp8Args): one scale per query block
  // and per key block needs blocks that divide the scale's rows (hopper/fp8_scales.cuh).
  bool takes_fp8_block_scales() const;
};

const std::vector<FwdKernelEntry>& fwd_kernels();

// What was compiled: dtypes, and the kernels' Q/K head dims (with their own V head
// dim or not), of the 16-bit kernels (the FP8 ones are fwd_fp8_enabled's).
std::vector<DType> fwd_dtypes();
std::vector<int> fwd_head_dims();
// The Q/K head dims of the e4m3 kernels, which a build may have at other head dims
// than its 16-bit ones (or without any of those).
std::vector<int> fwd_fp8_head_dims();

// The compiled (Q/K, V) head dims that run head dims (d, dv): of the kernels at
// least that wide in both, the narrowest in all (a kernel for a separate V head dim,
// or one of equal head dims); {0, 0} when none is. A kernel's extra columns read as
// zeros (TMA's out-of-bounds fill), which change no score, and are never stored.
struct HeadDims {
  int qk = 0;
  int v = 0;
};
HeadDims fwd_kernel_head_dims(std::int64_t d, std::int64_t dv);
// The same among the kernels of e4m3 inputs (fp8) or of 16-bit ones.
HeadDims fwd_kernel_head_dims(std::int64_t d, std::int64_t dv, bool fp8);

// The compiled kernels that can run `p` with inputs of `dtype` and an O of `out_dtype`,
// best first for its shape (tile shapes preferred by measurement, then the build's
// order): the first is forward()'s default. Without out_dtype: the inputs' (bf16 for
// e4m3 inputs).
std::vector<const FwdKernelEntry*> fwd_candidates(const Problem& p, DType dtype, DType out_dtype);
std::vector<const FwdKernelEntry*> fwd_candidates(const Problem& p, DType dtype);

// Whether varlen calls run on the forward kernels: the build's FA3_GPU_VARLEN option (on
// by default; tests/gpu/hopper/test_fwd_varlen.cpp).
bool fwd_varlen_enabled();

// Whether e4m3 (FP8) calls run on the FP8 forward kernels: the build's FA3_GPU_FP8
// option (on by default; tests/gpu/hopper/test_fwd_fp8.cpp).
bool fwd_fp8_enabled();

// Whether varlen calls with e4m3 inputs run on them too: the build's FA3_GPU_FP8_VARLEN
// option (on by default; tests/gpu/hopper/test_fwd_fp8_varlen.cpp).
bool fwd_fp8_varlen_enabled();

// Builds FwdParams from validated arguments; `num_sms` bounds the persistent grid.
// A varlen call's index tensors stay in device memory: the kernels read them.
FwdParams make_fwd_params(const Problem& p, const ForwardArgs& args, int num_sms);

// The widest V head dim of the built forward kernels (of FP8 inputs, or 16-bit ones); 0
// when none was built. run_forward takes wider ones, up to 512, in column slices.
int fwd_widest_head_dim_v(bool fp8);

// Whether the FP8 kernels transpose V in shared memory (the build's FA3_FP8_VT_SMEM, on
// by default; hopper/fwd_config.h's kFp8VtInSmem): TMA then reads an e4m3
// V, whose strides must suit it, and FP8 calls need no workspace.
bool fwd_fp8_vt_in_smem();

// The caller's workspace a call of `dtype` needs (ForwardArgs::workspace): Vᵀ for FP8
// calls (hopper/fp8_vt.h) unless the kernels transpose V in shared memory, nothing for
// the others.
std::size_t fwd_workspace_bytes(const Problem& p, DType dtype);

// Runs the default kernel, or the one named `kernel` when it is not null. An FP8 call
// first writes V transposed (hopper/fp8_vt.h) into the caller's workspace, unless the
// kernels transpose V in shared memory.
Status run_forward(const Problem& p, const ForwardArgs& args, int num_sms, cudaStream_t stream,
                   const char* kernel = nullptr);

}  // namespace fa3::hopper
