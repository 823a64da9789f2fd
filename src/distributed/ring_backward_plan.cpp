#include "distributed/ring_backward_plan.h"

#include <algorithm>

#include "common/status_macros.h"

namespace fa3::distributed::detail {

std::vector<BackwardStep> ring_backward_schedule(int rank, int world_size, bool causal) {
  std::vector<BackwardStep> steps;
  int step = 0;
  for (const RingStep& ring : ring_schedule(rank, world_size, causal)) {
    // The sums in hand go on to the next rank while the next shard's arrive in the
    // other buffer, which the sums sent the step before have left.
    steps.push_back({ring, step % 2, (step + 1) % 2});
    ++step;
  }
  return steps;
}

int grads_home(int world_size) { return world_size % 2; }

std::vector<BlockView> block_kinds(int world_size, bool causal) {
  std::vector<BlockView> kinds = {visible_block(0, 0, causal)};
  if (causal && world_size > 1) {
    kinds.push_back(visible_block(1, 0, causal));
    kinds.push_back(visible_block(0, 1, causal));
  }
  return kinds;
}

BackwardLayout backward_layout(const RingBackwardArgs& args, int world_size, std::size_t block_workspace_bytes) {
  BackwardLayout l;
  l.block_workspace_bytes = block_workspace_bytes;
  if (world_size <= 1) {
    l.bytes = block_workspace_bytes;
    return l;
  }
  l.k_bytes = bytes_of(args.k);
  l.v_bytes = bytes_of(args.v);
  l.dk_sum_bytes = static_cast<std::size_t>(args.k.numel()) * sizeof(float);
  l.dv_sum_bytes = static_cast<std::size_t>(args.v.numel()) * sizeof(float);
  WorkspaceCarver sums;  // one buffer of sums: dk, then dv
  sums.take(l.dk_sum_bytes);
  l.grads_dv = sums.take(l.dv_sum_bytes);
  WorkspaceCarver carve;
  l.receive[0] = carve.take(l.k_bytes + l.v_bytes);
  l.receive[1] = carve.take(l.k_bytes + l.v_bytes);
  l.grads[0] = carve.take(sums.end());
  l.grads[1] = carve.take(sums.end());
  l.dq_sum = carve.take(static_cast<std::size_t>(args.q.numel()) * sizeof(float));
  l.block_dq = carve.take(bytes_of(args.q));
  l.block_dk = carve.take(bytes_of(args.k));
  l.block_dv = carve.take(bytes_of(args.v));
  l.block_workspace = carve.take(block_workspace_bytes);
  l.bytes = carve.end();
  return l;
}

BackwardArgs shard_backward_args(const RingBackwardArgs& args) {
  BackwardArgs whole;
  whole.q = args.q;
  whole.k = args.k;
  whole.v = args.v;
  whole.out = args.out;
  whole.dout = args.dout;
  whole.lse = args.lse;
  whole.dq = args.dq;
  whole.dk = args.dk;
  whole.dv = args.dv;
  whole.options.softmax_scale = args.softmax_scale;
  whole.options.causal = args.causal;
  whole.options.sm_margin = args.sm_margin;
  whole.deterministic = args.deterministic;
  whole.workspace = args.workspace;
  whole.workspace_bytes = args.workspace_bytes;
  return whole;
}

BackwardArgs block_backward_args(const RingBackwardArgs& args, const BlockView& block, const KvShard& kv,
                                 const ShardGradients& grads) {
  BackwardArgs b;
  b.q = sequence_part(args.q, 1, block.q_half);
  b.k = sequence_part(kv.k, 1, block.kv_half);
  b.v = sequence_part(kv.v, 1, block.kv_half);
  b.out = sequence_part(args.out, 1, block.q_half);
  b.dout = sequence_part(args.dout, 1, block.q_half);
  b.lse = sequence_part(args.lse, 2, block.q_half);
  b.dq = sequence_part(grads.dq, 1, block.q_half);
  b.dk = sequence_part(grads.dk, 1, block.kv_half);
  b.dv = sequence_part(grads.dv, 1, block.kv_half);
  b.options.softmax_scale = args.softmax_scale;
  b.options.causal = block.causal;
  b.options.sm_margin = args.sm_margin;
  b.deterministic = args.deterministic;
  return b;
}

Status block_workspace_bytes(const RingBackwardArgs& args, int world_size, const ValidationTarget& target,
                             std::size_t* bytes) {
  *bytes = 0;
  ValidationTarget shapes_only = target;
  shapes_only.backward_workspace = nullptr;
  // The caller's gradients stand in for the block buffers: the same shapes and dtype.
  const ShardGradients grads{args.dq, args.dk, args.dv};
  for (const BlockView& block : block_kinds(world_size, args.causal)) {
    Problem problem;
    FA3_RETURN_IF_ERROR(
        validate_backward(block_backward_args(args, block, {args.k, args.v}, grads), shapes_only, &problem));
    if (target.backward_workspace) *bytes = std::max(*bytes, target.backward_workspace(problem, args.deterministic));
  }
  return Status::ok();
}

Status validate_ring_backward(const RingBackwardArgs& args, int rank, int world_size, const ValidationTarget& target,
                              bool check_workspace, BackwardLayout* layout) {
  FA3_RETURN_IF_ERROR(validate_shards(args.q, args.k, args.v,
                                      {{"out", &args.out},
                                       {"dout", &args.dout},
                                       {"dq", &args.dq},
                                       {"dk", &args.dk},
                                       {"dv", &args.dv}},
                                      args.causal, rank, world_size));
  // The ring checks its workspace itself: with more than one rank, the blocks' calls get
  // a part of it.
  ValidationTarget without_workspace = target;
  without_workspace.backward_workspace = nullptr;
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_backward(shard_backward_args(args), without_workspace, &problem));
  std::size_t block_bytes = 0;
  FA3_RETURN_IF_ERROR(block_workspace_bytes(args, world_size, target, &block_bytes));
  const BackwardLayout l = backward_layout(args, world_size, block_bytes);
  if (check_workspace) {
    FA3_RETURN_IF_ERROR(check_ring_workspace(args.workspace, args.workspace_bytes, l.bytes, world_size,
                                             "ring_backward_workspace_size", target));
  }
  *layout = l;
  return Status::ok();
}

}  // namespace fa3::distributed::detail
