// fa3 — fp32 sums of gradients, for the ring backward (distributed/ring_grads.h): a
// gradient in fp16 or bf16 added into an fp32 sum of its shape, and a sum written out in
// a gradient's dtype. 4-d views of one shape, any strides with the last dimension
// contiguous. Each element is summed by one thread, in the order of the calls, so the
// sums are deterministic.
#pragma once

#include <cuda_runtime_api.h>

#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3::distributed::detail {

// sum = grad (first) or sum + grad, in fp32; sum is fp32.
Status add_gradient(const TensorView& sum, const TensorView& grad, bool first, cudaStream_t stream);

// grad = sum, rounded to grad's dtype (to nearest even).
Status write_gradient(const TensorView& sum, const TensorView& grad, cudaStream_t stream);

}  // namespace fa3::distributed::detail
