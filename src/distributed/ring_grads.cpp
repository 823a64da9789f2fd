#include "distributed/ring_grads.h"

#include "common/status_macros.h"
#include "distributed/grad_sum.h"
#include "fa3/attention.h"

namespace fa3::distributed::detail {

GradientSums gradient_sums(const RingBackwardArgs& args, const BackwardLayout& layout) {
  char* ws = static_cast<char*>(args.workspace);
  const DType dtype = args.q.dtype;
  GradientSums s;
  s.block = {contiguous_like(ws + layout.block_dq, dtype, args.q, args.q.shape[3]),
             contiguous_like(ws + layout.block_dk, dtype, args.k, args.k.shape[3]),
             contiguous_like(ws + layout.block_dv, dtype, args.v, args.v.shape[3])};
  s.dq = contiguous_like(ws + layout.dq_sum, DType::kFloat32, args.q, args.q.shape[3]);
  for (int i = 0; i < 2; ++i) {
    s.dk[i] = contiguous_like(ws + layout.grads[i], DType::kFloat32, args.k, args.k.shape[3]);
    s.dv[i] = contiguous_like(ws + layout.grads[i] + layout.grads_dv, DType::kFloat32, args.v, args.v.shape[3]);
  }
  s.block_workspace = ws + layout.block_workspace;
  s.block_workspace_bytes = layout.block_workspace_bytes;
  return s;
}

Status block_backward(const RingBackwardArgs& args, const GradientSums& sums, const BlockView& block,
                      const KvShard& kv, cudaStream_t stream) {
  BackwardArgs call = block_backward_args(args, block, kv, sums.block);
  call.workspace = sums.block_workspace;
  call.workspace_bytes = sums.block_workspace_bytes;
  return backward(call, stream);
}

Status add_block_dq(const GradientSums& sums, const BlockView& block, bool first, cudaStream_t stream) {
  return add_gradient(sequence_part(sums.dq, 1, block.q_half), sequence_part(sums.block.dq, 1, block.q_half), first,
                      stream);
}

Status add_block_dkv(const GradientSums& sums, const BlockView& block, int buffer, bool first, cudaStream_t stream) {
  FA3_RETURN_IF_ERROR(add_gradient(sequence_part(sums.dk[buffer], 1, block.kv_half),
                                   sequence_part(sums.block.dk, 1, block.kv_half), first, stream));
  return add_gradient(sequence_part(sums.dv[buffer], 1, block.kv_half),
                      sequence_part(sums.block.dv, 1, block.kv_half), first, stream);
}

Status write_dq(const GradientSums& sums, const TensorView& dq, cudaStream_t stream) {
  return write_gradient(sums.dq, dq, stream);
}

Status write_dkv(const GradientSums& sums, int buffer, const TensorView& dk, const TensorView& dv,
                 cudaStream_t stream) {
  FA3_RETURN_IF_ERROR(write_gradient(sums.dk[buffer], dk, stream));
  return write_gradient(sums.dv[buffer], dv, stream);
}

}  // namespace fa3::distributed::detail
