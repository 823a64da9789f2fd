// Ring attention over NCCL (fa3/distributed.h). Per step, in the order the host
// enqueues it:
//   compute stream: wait for the shard in hand to have arrived (`received`);
//   comm stream:    wait until the receive buffer's previous shard is no longer read
//                   (`computed`), then one grouped ncclSend of the shard in hand to the
//                   next rank and ncclRecv of the next shard from the previous one;
//                   record `received`;
//   compute stream: fa3::forward on the visible part of the block, merge it into the
//                   running fp32 result (distributed/ring_result.h); record `computed`.
// The compute stream's wait is enqueued before the comm stream re-records `received`,
// so each step waits for its own shard and the transfer of shard s + 1 overlaps the
// compute of shard s. At the end a 1-part merge writes the running result into the
// caller's out and lse, in their dtype.
#include "api/validate.h"
#include "common/status_macros.h"
#include "distributed/ring_comm.h"
#include "distributed/ring_plan.h"
#include "distributed/ring_result.h"
#include "fa3/attention.h"
#include "fa3/distributed.h"

namespace fa3::distributed {
namespace {

using detail::Event;
using detail::KvShard;
using detail::Ring;

KvShard shard_in(const RingArgs& args, const detail::WorkspaceLayout& layout, int buffer) {
  return detail::kv_shard(args.k, args.v, args.workspace, layout.receive, buffer);
}

// One block: fa3::forward on the visible part, its (out, lse) written into the block
// buffers at the rows it covers, then merged into those rows of the running result.
Status compute_block(const RingArgs& args, const KvShard& shard, const detail::RingStep& step,
                     const detail::WorkspaceLayout& layout, bool first, cudaStream_t stream) {
  char* ws = static_cast<char*>(args.workspace);
  const std::int64_t batch = args.q.shape[0], shard_len = args.q.shape[1], nheads = args.q.shape[2];
  const std::int64_t head_dim_v = args.v.shape[3];
  const TensorView block_out = detail::contiguous_like(ws + layout.block_out, args.q.dtype, args.q, head_dim_v);
  const TensorView block_lse =
      TensorView::contiguous(ws + layout.block_lse, DType::kFloat32, {batch, nheads, shard_len});
  ForwardArgs fwd;
  fwd.q = detail::sequence_part(args.q, 1, step.block.q_half);
  fwd.k = detail::sequence_part(shard.k, 1, step.block.kv_half);
  fwd.v = detail::sequence_part(shard.v, 1, step.block.kv_half);
  fwd.out = detail::sequence_part(block_out, 1, step.block.q_half);
  fwd.lse = detail::sequence_part(block_lse, 2, step.block.q_half);
  fwd.options.softmax_scale = args.softmax_scale;
  fwd.options.causal = step.block.causal;
  fwd.options.sm_margin = args.sm_margin;
  FA3_RETURN_IF_ERROR(forward(fwd, stream));
  // The first step's block is the own shard's, which covers every query row.
  return detail::merge_block(detail::running_result(args, layout), fwd.out, fwd.lse, step.block.q_half, first, stream);
}

Status run_ring(const RingArgs& args, const Ring& ring, ncclComm_t comm, cudaStream_t stream) {
  const detail::WorkspaceLayout layout = detail::workspace_layout(args, ring.size);
  const cudaStream_t comm_stream = args.comm_stream != nullptr ? args.comm_stream : stream;
  Event received, computed;
  FA3_RETURN_IF_ERROR(received.create());
  FA3_RETURN_IF_ERROR(computed.create());
  // The caller's q, k and v are ready on the compute stream: the first send waits for them.
  FA3_RETURN_IF_ERROR(computed.record(stream));
  const auto steps = detail::ring_schedule(ring.rank, ring.size, args.causal);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const detail::RingStep& step = steps[i];
    const KvShard hand = shard_in(args, layout, step.hand);
    if (step.hand >= 0) FA3_RETURN_IF_ERROR(received.wait(stream));
    if (step.receive >= 0) {
      FA3_RETURN_IF_ERROR(computed.wait(comm_stream));
      FA3_RETURN_IF_ERROR(detail::exchange_shard(hand, shard_in(args, layout, step.receive), ring, comm, comm_stream));
      FA3_RETURN_IF_ERROR(received.record(comm_stream));
    }
    FA3_RETURN_IF_ERROR(compute_block(args, hand, step, layout, i == 0, stream));
    FA3_RETURN_IF_ERROR(computed.record(stream));
  }
  // The last sends read buffers the caller may reuse after the call: the compute
  // stream, and so the caller, waits for the transfers too.
  FA3_RETURN_IF_ERROR(received.record(comm_stream));
  FA3_RETURN_IF_ERROR(received.wait(stream));
  return detail::write_result(detail::running_result(args, layout), args.out, args.lse, stream);
}

}  // namespace

Status ring_workspace_size(const RingArgs& args, int world_size, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: required, got a null pointer"};
  ValidationTarget target = gpu_target();
  target.locate = nullptr;  // the size query runs before the buffers exist
  FA3_RETURN_IF_ERROR(detail::validate_ring(args, 0, world_size, target, false));
  *bytes = detail::workspace_layout(args, world_size).bytes;
  return Status::ok();
}

Status ring_forward(const RingArgs& args, ncclComm_t comm, cudaStream_t stream) {
  Ring ring{};
  FA3_RETURN_IF_ERROR(detail::ring_of(comm, &ring));
  FA3_RETURN_IF_ERROR(detail::validate_ring(args, ring.rank, ring.size, gpu_target(), true));
  if (ring.size == 1) return forward(detail::shard_forward_args(args), stream);
  return run_ring(args, ring, comm, stream);
}

}  // namespace fa3::distributed
