// fa3 — the query rows of a varlen call that take part in no sequence (fa3/attention.h):
// those past a sequence's seqused_q and those past cu_seqlens_q[batch]. The attention
// kernels compute sequences' rows only; these get out 0 and lse -inf from a small kernel
// of their own, as the CPU path gives them. Its ranges come from the index tensors in
// device memory, so the host needs no copy of them.
#pragma once

#include <cuda_runtime_api.h>

#include "fa3/status.h"
#include "hopper/bwd_params.h"
#include "hopper/fwd_params.h"

namespace fa3::hopper {

// Writes out 0 and lse -inf (when lse is given) to the query rows of no sequence of the
// varlen call `p` (nothing for a fixed-length call); `element_bytes` is out's element
// size (2 for bf16 and fp16). Enqueued on `stream`; independent of the forward kernel,
// whose rows are others.
Status launch_clear_unused_rows(const FwdParams& p, int element_bytes, cudaStream_t stream);

// The backward's: dq 0 on the query rows of no sequence, dk and dv 0 on the keys of none
// (those past seqused_k, and past cu_seqlens_k[batch]). Independent of the backward's
// kernels, whose rows are others.
Status launch_clear_unused_grad_rows(const BwdParams& p, int element_bytes, cudaStream_t stream);

}  // namespace fa3::hopper
