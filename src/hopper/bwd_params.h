// fa3 — everything a backward launch needs, in plain types (no CuTe), so that host-only
// code (dispatch, tests) can build it.
#pragma once

#include <cstdint>

#include "hopper/bwd_workspace.h"

namespace fa3::hopper {

struct BwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  const float* sinks = nullptr;  // may be null: none
  float* dsinks = nullptr;       // may be null: not asked for (only with sinks)
  std::int64_t sinks_stride = 0, dsinks_stride = 0;

  // Strides in elements, (batch, row, head); the head dim is contiguous.
  std::int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  std::int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  std::int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  std::int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  std::int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;
  std::int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  std::int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  std::int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int nheads_q = 0;
  int nheads_kv = 0;
  int head_dim = 0;    // of Q and K (and their gradients)
  int head_dim_v = 0;  // of V and O (and their gradients); the kernel's is the larger

  float softmax_scale = 0.f;
  float softmax_scale_log2 = 0.f;  // softmax_scale * log2(e)
  float softcap = 0.f;             // 0: off
  // The mask window and chunk as FwdParams has them (general kernels only).
  int window_left = -1;
  int window_right = -1;
  int chunk = 0;
  std::uint32_t chunk_mul = 0;
  int chunk_shift = 0;
  bool deterministic = false;

  // A variable-length batch, as FwdParams has it: when cu_seqlens_q is not null, q, k, v,
  // out, dout and the gradients are packed (total, nheads, dim) tensors, which the kernels
  // see as one batch entry of total_q or total_k rows, lse is (nheads, total_q), and
  // seqlen_q / seqlen_k are max_seqlen_q / max_seqlen_k. Device memory.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqused_q = nullptr;  // may be null
  const int* seqused_k = nullptr;  // may be null
  int total_q = 0;
  int total_k = 0;

  void* workspace = nullptr;  // laid out as `layout` says
  BwdWorkspace layout;

  int num_sms = 0;  // persistent grid size upper bound
};

}  // namespace fa3::hopper
