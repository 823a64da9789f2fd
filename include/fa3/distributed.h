// fa3 — context parallelism over NCCL: one exact attention over a sequence sharded
// across the ranks of an NCCL communicator (ring attention).
//
// Each rank holds its shard of q, k and v along the sequence, in fa3's layouts (see
// fa3/attention.h), every rank's shard of the same shape. K/V shards travel around the
// ring of ranks (rank r sends to r + 1 and receives from r - 1, mod W) by grouped
// ncclSend / ncclRecv on `comm_stream`, while fa3::forward attends the query shard to
// the K/V shard in hand on the compute stream; each block's (out, lse) is merged into
// the running result exactly, in fp32, by fa3::merge_attention_states (fa3/merge.h),
// which also writes the result into out and lse at the end. After W - 1 hops every
// rank has seen every K/V shard: its out and lse are those of its queries over the
// whole sequence.
//
// Shards: without causal, any W equal shards (attention without a mask does not depend
// on the order of keys; the usual choice is rank r holding the r-th contiguous piece).
// With causal, zigzag shards, as fa3.distributed.zigzag_shard makes them: the sequence
// cut in 2W equal chunks, rank r holding chunks r and 2W - 1 - r, one after the other,
// so that every rank does the same causal work.
//
// The backward (ring_backward) runs the same ring. At each step fa3::backward computes
// the gradients of the block in hand from the forward's global out and lse of the query
// rows (with the row's own statistics, not the block's, its probabilities and
// D = rowsum(dout * out) are those of the whole row, so the block's gradients are its
// exact part of the whole); dq is summed at home in fp32, and the fp32 dk/dv sums travel
// with their K/V shard around the ring (a hop after each step's block, W in all, one
// more than K/V makes), arriving back at their owner after the last step. Each block's gradients come out of
// fa3::backward in the inputs' dtype before they are summed.
//
// The host-side plans (schedules, zigzag blocks, workspaces, rules) are tested on the
// CPU; the one-GPU tests (tests/gpu/distributed: the forward's merges and the backward's
// steps over simulated ranks) pass on an H200; the rings themselves (two GPUs or more)
// have not run yet.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>

#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3::distributed {

struct RingArgs {
  TensorView q;    // this rank's shard: (batch, shard_len, nheads_q, head_dim), fp16 or bf16
  TensorView k;    // (batch, shard_len, nheads_kv, head_dim), contiguous: it travels whole
  TensorView v;    // (batch, shard_len, nheads_kv, head_dim_v), contiguous
  TensorView out;  // written: (batch, shard_len, nheads_q, head_dim_v), q's dtype
  TensorView lse;  // optional: written, fp32 (batch, nheads_q, shard_len), over the whole sequence
  float softmax_scale = 0.f;  // 0 selects 1/sqrt(head_dim)
  bool causal = false;        // over the whole sequence; the shards are then zigzag (see above)
  // SMs every block's attention call leaves free (AttentionOptions::sm_margin), for the
  // transfers that run beside it.
  int sm_margin = 0;
  // The stream the transfers run on, so that they overlap the compute stream's kernels;
  // nullptr runs them on the compute stream (correct, without overlap). Ordered after
  // the compute stream's earlier work, and the compute stream waits for it at the end.
  cudaStream_t comm_stream = nullptr;
  // Device scratch memory, owned by the caller: at least ring_workspace_size() bytes,
  // 256-byte aligned (two K/V receive buffers, fp32 running out and lse, one block's
  // out and lse). Unused (may be null) with one rank.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// The workspace ring_forward needs for `args` on a ring of `world_size` ranks, in
// bytes. Validates args as ring_forward does, except the workspace and where pointers
// live; reads no tensor data and enqueues nothing.
Status ring_workspace_size(const RingArgs& args, int world_size, std::size_t* bytes);

// Ring attention forward on the current CUDA device, enqueued on `stream` (and on
// args.comm_stream), with the caller's communicator: every rank of `comm` must call it
// with shards of one problem (same shapes, dtype, options), and the call returns once
// its work is enqueued. One rank is fa3::forward. On a rejection nothing is enqueued and
// no output is touched. Validation is local (no collective is spent on it): a rank whose
// arguments are rejected does not join the ring, and its peers then wait for it.
Status ring_forward(const RingArgs& args, ncclComm_t comm, cudaStream_t stream);

// The backward of ring_forward: this rank's shards of the gradients of q, k and v. The
// shards, causal (zigzag shards), softmax_scale, comm_stream and the rules are
// ring_forward's.
struct RingBackwardArgs {
  TensorView q;     // the forward's shards: (batch, shard_len, nheads_q, head_dim), fp16 or bf16
  TensorView k;     // (batch, shard_len, nheads_kv, head_dim), contiguous: it travels whole
  TensorView v;     // (batch, shard_len, nheads_kv, head_dim_v), contiguous
  TensorView out;   // ring_forward's out for this rank's queries (over the whole sequence)
  TensorView dout;  // the loss's gradient with respect to out; out's shape and dtype
  TensorView lse;   // ring_forward's lse: fp32 (batch, nheads_q, shard_len), over the whole sequence
  TensorView dq;    // written: q's shape and dtype, any strides fa3::backward takes
  TensorView dk;    // written: k's shape and dtype
  TensorView dv;    // written: v's shape and dtype
  float softmax_scale = 0.f;  // 0 selects 1/sqrt(head_dim); the forward's
  bool causal = false;        // the forward's
  int sm_margin = 0;          // as in RingArgs
  // Passed to every block's fa3::backward; the blocks' sums follow the ring's fixed step
  // order, so that repeated calls give bitwise identical dq, dk and dv.
  bool deterministic = false;
  cudaStream_t comm_stream = nullptr;  // as in RingArgs
  // Device scratch memory, owned by the caller: at least ring_backward_workspace_size()
  // bytes, 256-byte aligned, of the current device (two K/V receive buffers, two fp32
  // dk/dv sums that travel, the fp32 dq sum, one block's dq, dk and dv, and the block
  // calls' own fa3::backward workspace). With one rank, fa3::backward's workspace.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// The workspace ring_backward needs for `args` on a ring of `world_size` ranks, in
// bytes. Validates args as ring_backward does, except the workspace and where pointers
// live; reads no tensor data and enqueues nothing.
Status ring_backward_workspace_size(const RingBackwardArgs& args, int world_size, std::size_t* bytes);

// Ring attention backward on the current CUDA device, enqueued on `stream` (and on
// args.comm_stream), with the caller's communicator, as ring_forward: every rank calls it
// with shards of one problem, and it returns once its work is enqueued. One rank is
// fa3::backward. On a rejection nothing is enqueued and no output is touched; validation
// is local, as in ring_forward.
Status ring_backward(const RingBackwardArgs& args, ncclComm_t comm, cudaStream_t stream);

}  // namespace fa3::distributed
