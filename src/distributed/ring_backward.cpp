// Ring attention backward over NCCL (fa3/distributed.h). Per step, in the order the host
// enqueues it:
//   compute stream: wait for the K/V shard in hand to have arrived (`kv_received`);
//   comm stream:    wait until the receive buffer's previous shard is no longer read
//                   (`computed`), then the hop of the shard in hand to the next rank and
//                   of the next shard from the previous one; record `kv_received`;
//   compute stream: fa3::backward on the visible block into the block buffers; its dq
//                   added into the dq sum; wait for the dk/dv sums of the shard in hand
//                   (`grads_received`; at step 0 this rank starts them) and add the
//                   block's dk and dv into them; record `computed`;
//   comm stream:    wait for `computed`, then the hop of those sums to the next rank and
//                   of the next shard's sums from the previous one; record
//                   `grads_received`.
// The block backward of step s + 1 waits only for its K/V shard, so it overlaps the hop of
// step s's sums and that of the shard for step s + 2; only its small additions wait for
// the sums. After the last step the sums of this rank's own shard arrive home, and the
// fp32 sums are written into the caller's dq, dk and dv in their dtype.
#include "api/validate.h"
#include "common/status_macros.h"
#include "distributed/ring_backward_plan.h"
#include "distributed/ring_comm.h"
#include "distributed/ring_grads.h"
#include "fa3/attention.h"
#include "fa3/distributed.h"

namespace fa3::distributed {
namespace {

using detail::Event;
using detail::KvShard;
using detail::Ring;

KvShard shard_in(const RingBackwardArgs& args, const detail::BackwardLayout& layout, int buffer) {
  return detail::kv_shard(args.k, args.v, args.workspace, layout.receive, buffer);
}

// The dk/dv sums of buffer `send` to the next rank, the previous rank's into `receive`.
Status exchange_sums(const detail::GradientSums& sums, const detail::BackwardLayout& layout, int send, int receive,
                     const Ring& ring, ncclComm_t comm, cudaStream_t stream) {
  return detail::exchange({{sums.dk[send].data, sums.dk[receive].data, layout.dk_sum_bytes},
                           {sums.dv[send].data, sums.dv[receive].data, layout.dv_sum_bytes}},
                          ring, comm, stream);
}

Status run_ring(const RingBackwardArgs& args, const detail::BackwardLayout& layout, const Ring& ring,
                ncclComm_t comm, cudaStream_t stream) {
  const cudaStream_t comm_stream = args.comm_stream != nullptr ? args.comm_stream : stream;
  const detail::GradientSums sums = detail::gradient_sums(args, layout);
  Event kv_received, grads_received, computed;
  FA3_RETURN_IF_ERROR(kv_received.create());
  FA3_RETURN_IF_ERROR(grads_received.create());
  FA3_RETURN_IF_ERROR(computed.create());
  // The caller's inputs are ready on the compute stream: the first send waits for them.
  FA3_RETURN_IF_ERROR(computed.record(stream));
  const auto steps = detail::ring_backward_schedule(ring.rank, ring.size, args.causal);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const detail::BackwardStep& step = steps[i];
    const bool first = i == 0;  // the own shard's block, which covers every row of q, k and v
    const KvShard hand = shard_in(args, layout, step.ring.hand);
    if (step.ring.hand >= 0) FA3_RETURN_IF_ERROR(kv_received.wait(stream));
    if (step.ring.receive >= 0) {
      FA3_RETURN_IF_ERROR(computed.wait(comm_stream));
      FA3_RETURN_IF_ERROR(
          detail::exchange_shard(hand, shard_in(args, layout, step.ring.receive), ring, comm, comm_stream));
      FA3_RETURN_IF_ERROR(kv_received.record(comm_stream));
    }
    FA3_RETURN_IF_ERROR(detail::block_backward(args, sums, step.ring.block, hand, stream));
    FA3_RETURN_IF_ERROR(detail::add_block_dq(sums, step.ring.block, first, stream));
    if (!first) FA3_RETURN_IF_ERROR(grads_received.wait(stream));
    FA3_RETURN_IF_ERROR(detail::add_block_dkv(sums, step.ring.block, step.grads_hand, first, stream));
    FA3_RETURN_IF_ERROR(computed.record(stream));
    FA3_RETURN_IF_ERROR(computed.wait(comm_stream));
    FA3_RETURN_IF_ERROR(exchange_sums(sums, layout, step.grads_hand, step.grads_receive, ring, comm, comm_stream));
    FA3_RETURN_IF_ERROR(grads_received.record(comm_stream));
  }
  FA3_RETURN_IF_ERROR(detail::write_dq(sums, args.dq, stream));
  // The last hop, the comm stream's last work, brings the own sums home: waiting for it
  // the compute stream, and so the caller, also waits for every transfer of the call.
  FA3_RETURN_IF_ERROR(grads_received.wait(stream));
  return detail::write_dkv(sums, detail::grads_home(ring.size), args.dk, args.dv, stream);
}

}  // namespace

Status ring_backward_workspace_size(const RingBackwardArgs& args, int world_size, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: required, got a null pointer"};
  ValidationTarget target = gpu_backward_target();
  target.locate = nullptr;  // the size query runs before the buffers exist
  detail::BackwardLayout layout;
  FA3_RETURN_IF_ERROR(detail::validate_ring_backward(args, 0, world_size, target, false, &layout));
  *bytes = layout.bytes;
  return Status::ok();
}

Status ring_backward(const RingBackwardArgs& args, ncclComm_t comm, cudaStream_t stream) {
  Ring ring{};
  FA3_RETURN_IF_ERROR(detail::ring_of(comm, &ring));
  detail::BackwardLayout layout;
  FA3_RETURN_IF_ERROR(detail::validate_ring_backward(args, ring.rank, ring.size, gpu_backward_target(), true, &layout));
  if (ring.size == 1) return backward(detail::shard_backward_args(args), stream);
  return run_ring(args, layout, ring, comm, stream);
}

}  // namespace fa3::distributed
