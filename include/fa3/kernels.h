// fa3 — choosing among the compiled forward kernels, for benchmarks and tuning.
//
// fa3::forward picks a kernel (a CTA tile shape) by problem shape. These calls list
// the kernels that can run a problem and run a named one instead. Different kernels
// sum in different orders, so their outputs may differ by rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "fa3/attention.h"
#include "fa3/status.h"

namespace fa3 {

// Names of the forward kernels built for args' dtype, head dim and mask, the one
// fa3::forward would run first: "MxN" (query rows x keys per block), with what the
// build forced appended: "-o" + O's path out (s: own shared buffer, q: Q's buffer,
// r: registers), "-kv" + the K/V ring depth, "-q" + the Q buffers. Validates `args`
// as fa3::forward does but reads no tensor data and needs no GPU.
Status forward_kernels(const ForwardArgs& args, std::vector<std::string>* names);

// fa3::forward with the kernel named `kernel` (one of forward_kernels').
Status forward_with_kernel(const ForwardArgs& args, const std::string& kernel, cudaStream_t stream);

}  // namespace fa3
