// fa3 — the attention sinks' gradient on the GPU (fa3/attention.h):
//   dsinks_h = -sum over the rows i of head h, in every batch, of exp(sink_h - L_i) * D_i,
// (every sequence's rows, in a varlen call) from the caller's LSE and the D = rowsum(dO∘O)
// the backward's preprocess kernel left in the workspace. One CTA per head sums in a fixed order, so the result is the same
// bit for bit in every mode; the rows it reads are a few floats per query, next to the
// main kernel's work nothing.
#pragma once

#include <cuda_runtime_api.h>

#include "fa3/status.h"
#include "hopper/bwd_params.h"

namespace fa3::hopper {

// Writes p.dsinks (nothing when it is null); enqueue after the preprocess kernel.
Status launch_sinks_grad(const BwdParams& p, cudaStream_t stream);

}  // namespace fa3::hopper
