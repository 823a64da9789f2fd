// fa3 — the host-side plan of the ring backward (fa3/distributed.h): its steps (the
// forward's, plus the dk/dv sums that travel with their K/V shard), the blocks' calls to
// fa3::backward, the workspace's layout and the rules of a call. No NCCL and no device
// work here, so all of it is tested on the CPU.
#pragma once

#include <cstddef>
#include <vector>

#include "api/validate.h"
#include "distributed/ring_plan.h"
#include "fa3/attention.h"
#include "fa3/distributed.h"

namespace fa3::distributed::detail {

// One step of the backward on one rank: the forward's step (the K/V shard in hand, what
// the queries see of it, its receive buffer), and the buffers of the fp32 dk/dv sums.
// The sums of the shard in hand are in grads_hand; they are sent on after the step,
// while the sums of the next step's shard arrive in grads_receive. After the last step
// the sums of this rank's own shard arrive home, in grads_receive (grads_home).
struct BackwardStep {
  RingStep ring;
  int grads_hand;     // 0 or 1
  int grads_receive;  // the other one
};
std::vector<BackwardStep> ring_backward_schedule(int rank, int world_size, bool causal);
int grads_home(int world_size);

// The distinct blocks the ranks of a ring compute (visible_block over every pair of
// ranks): the own shard's; with causal and more than one rank, also an earlier rank's
// (every query, its first chunk of keys) and a later rank's (the second query chunk, all
// of its keys).
std::vector<BlockView> block_kinds(int world_size, bool causal);

// Byte offsets into the workspace, each 256-byte aligned. With one rank the workspace is
// fa3::backward's alone (block_workspace at 0, bytes = block_workspace_bytes).
struct BackwardLayout {
  std::size_t k_bytes = 0, v_bytes = 0;  // one shard of each, as sent
  std::size_t receive[2] = {0, 0};       // K/V receive buffers: K, then V
  // Two buffers of fp32 dk/dv sums of one shard (k's and v's shapes): dk at grads[i],
  // dv at grads[i] + grads_dv.
  std::size_t dk_sum_bytes = 0, dv_sum_bytes = 0;
  std::size_t grads[2] = {0, 0};
  std::size_t grads_dv = 0;
  std::size_t dq_sum = 0;  // fp32, q's shape
  // One block's gradients as fa3::backward writes them, in q's dtype, of the whole
  // shard's shapes (a block covering part of the shard writes the rows it covers).
  std::size_t block_dq = 0, block_dk = 0, block_dv = 0;
  std::size_t block_workspace = 0, block_workspace_bytes = 0;  // the blocks' fa3::backward workspace
  std::size_t bytes = 0;                                       // the whole workspace
};
// Assumes args passed validate_shards; block_workspace_bytes from block_workspace_bytes().
BackwardLayout backward_layout(const RingBackwardArgs& args, int world_size, std::size_t block_workspace_bytes);

// The local call on the whole shard, with the caller's workspace: the one call a ring of
// one rank makes, and the one whose rules every block's call follows from.
BackwardArgs shard_backward_args(const RingBackwardArgs& args);

// The gradients of one block call, as views of the whole shard's shapes.
struct ShardGradients {
  TensorView dq, dk, dv;
};
// The fa3::backward call of `block` of the K/V shard `kv`: the block's rows of q, out,
// dout and lse (the whole row's statistics), its part of kv, its rows of `grads`. The
// workspace is left to the caller.
BackwardArgs block_backward_args(const RingBackwardArgs& args, const BlockView& block, const KvShard& kv,
                                 const ShardGradients& grads);

// The largest workspace fa3::backward needs for any block of the ring (block_kinds), by
// `target`'s backward_workspace (0 without one). Assumes args passed validate_shards.
Status block_workspace_bytes(const RingBackwardArgs& args, int world_size, const ValidationTarget& target,
                             std::size_t* bytes);

// The rules of ring_backward for `rank` of `world_size`, against `target` (fa3::backward's
// on the device; one without pointer checks or workspace sizes in tests), and the
// workspace's layout when they hold. check_workspace: whether the workspace is checked
// (not for the size query).
Status validate_ring_backward(const RingBackwardArgs& args, int rank, int world_size, const ValidationTarget& target,
                              bool check_workspace, BackwardLayout* layout);

}  // namespace fa3::distributed::detail
