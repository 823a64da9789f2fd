// fa3 — picks the compiled forward kernel for a validated problem.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"
#include "hopper/fwd_params.h"

namespace fa3::hopper {

// What was compiled (from the configure-time kernel list).
std::vector<DType> fwd_dtypes();
std::vector<int> fwd_head_dims();

// Builds FwdParams from validated arguments; `num_sms` bounds the persistent grid.
FwdParams make_fwd_params(const Problem& p, const ForwardArgs& args, int num_sms);

Status run_forward(const Problem& p, const ForwardArgs& args, int num_sms, cudaStream_t stream);

}  // namespace fa3::hopper
