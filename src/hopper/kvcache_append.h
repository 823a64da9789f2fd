// fa3 — the steps of a KV-cache call before its attention: k_new and v_new written into
// the cache (k_new rotated when the call has a rotary embedding), and q's rotated copy.
// Plain C++: the dispatcher (hopper/kvcache.cpp) includes this, not the kernels.
#pragma once

#include <cuda_runtime_api.h>

#include "fa3/status.h"
#include "fa3/tensor.h"
#include "hopper/kvcache_params.h"

namespace fa3::hopper {

// Enqueues on `stream` the append (when index.seqlen_new > 0) and q's rotation (when
// rotary_dim > 0) of inputs of `dtype` (bf16 or fp16).
Status launch_kvcache_append(const KvAppendParams& params, DType dtype, cudaStream_t stream);

}  // namespace fa3::hopper
