// fa3 — the compiled backward kernels, and running one for a validated problem.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"
#include "hopper/bwd_params.h"
#include "hopper/mask_kind.h"

namespace fa3::hopper {

// One compiled backward kernel family (preprocess, main kernel, postprocess) from the
// configure-time kernel list. `varlen`: the instance that carries the varlen paths and
// runs varlen calls (built at the head dims of FA3_BWD_VARLEN_HEAD_DIMS); the others run
// fixed-length calls.
struct BwdKernelEntry {
  DType dtype;
  int head_dim;
  MaskKind mask;
  bool varlen;
  Status (*launch)(const BwdParams&, cudaStream_t);
};

const std::vector<BwdKernelEntry>& bwd_kernels();

// What was compiled.
std::vector<DType> bwd_dtypes();
std::vector<int> bwd_head_dims();

// The compiled head dim that runs head dim `d`: the smallest at least `d`, whose extra
// columns read as zeros and are never stored; 0 when none is.
int bwd_kernel_head_dim(std::int64_t d);

// The compiled head dim that runs problem `p`: that of the larger of its Q/K and V head
// dims, so that the narrower tensors take it with zero columns too (TMA reads past a
// row's end as zeros; their gradients' stores stop at the row's end). Their GEMMs do the
// padded columns' work: DeepSeek-V3's (192, 128) runs in (192, 192)'s time.
int bwd_problem_head_dim(const Problem& p);

// The workspace a call on `p` needs (hopper/bwd_workspace.h).
BwdWorkspace bwd_workspace(const Problem& p, bool deterministic);

// Whether this build has varlen backward kernels at all (FA3_GPU_VARLEN), the kernel head
// dims that have one (a varlen instance in the registry, of some dtype), and whether
// `head_dim` is among them: a varlen call of any other head dim is refused with
// kNotSupported naming cu_seqlens_q.
bool bwd_varlen_enabled();
std::vector<int> bwd_varlen_head_dims();
bool bwd_runs_varlen(int head_dim);

// The mask family whose kernel runs problem `p` with inputs of `dtype`: the problem's
// (mask_kind), except that a varlen call runs on its family's varlen instance where the
// build has one (FA3_BWD_VARLEN_OWN_HEAD_DIMS), else on the general family's.
MaskKind bwd_mask_kind(const Problem& p, DType dtype);

// Builds BwdParams from validated arguments; `num_sms` bounds the persistent grid.
BwdParams make_bwd_params(const Problem& p, const BackwardArgs& args, int num_sms);

Status run_backward(const Problem& p, const BackwardArgs& args, int num_sms, cudaStream_t stream);

}  // namespace fa3::hopper
