// fa3 — everything a forward kernel launch needs, in plain types (no CuTe), so that
// host-only code (dispatch, tests) can build it.
#pragma once

#include <cstdint>

namespace fa3::hopper {

struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // may be null: no lse requested
  const float* sinks = nullptr;  // may be null: none
  std::int64_t sinks_stride = 0;

  // Strides in elements, (batch, row, head); the head dim is contiguous.
  std::int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  std::int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  std::int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  // v's head-dim stride: 1, except an e4m3 v with its keys contiguous (FlashAttention-3's
  // V_colmajor), which only the transpose into Vᵀ reads (hopper/fp8_vt.h).
  std::int64_t v_col_stride = 1;
  std::int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  int batch = 0;
  int seqlen_q = 0;  // a varlen call's max_seqlen_q: a bound, not every sequence's length
  int seqlen_k = 0;  // a varlen call's max_seqlen_k
  int nheads_q = 0;
  int nheads_kv = 0;
  int head_dim = 0;    // of Q and K
  int head_dim_v = 0;  // of V and O

  float softmax_scale = 0.f;
  float softmax_scale_log2 = 0.f;  // softmax_scale * log2(e): the kernels use exp2
  float softcap = 0.f;
  // Resolved mask window (query i sees keys i + sk - sq - left ... i + sk - sq + right),
  // as set_mask_params (hopper/mask_kind.h) sets it: an unbounded side as the sequence's
  // length.
  int window_left = -1;
  int window_right = -1;
  // attention_chunk (0: none): query i sees only the keys of its own chunk of `chunk`
  // positions. floor(pos / chunk) = umulhi(pos, chunk_mul) >> chunk_shift for positions in
  // [0, 2^31), so that the kernels divide without a division; set_mask_params sets these
  // too.
  int chunk = 0;
  std::uint32_t chunk_mul = 0;
  int chunk_shift = 0;

  // A variable-length batch (fa3/attention.h), when cu_seqlens_q is not null: q, k, v and
  // out are packed (total, nheads, dim) tensors, which the kernels see as one batch entry
  // of total_q or total_k rows (the batch strides are unused), and lse is (nheads,
  // total_q). Sequence b's rows start at cu_seqlens[b]; it has seqused[b] of them, or
  // cu_seqlens[b + 1] - cu_seqlens[b] without seqused. Device memory, whose values are
  // the caller's contract (the host cannot read them without a synchronization).
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqused_q = nullptr;  // may be null
  const int* seqused_k = nullptr;  // may be null
  int total_q = 0;
  int total_k = 0;

  // An FP8 call's scales (fa3/attention.h's Fp8Args), each null when not given, strides
  // in elements: descales (batch, kv head), block scales (batch, head, block of
  // kFp8BlockRows rows). vt is V transposed by hopper/fp8_vt.h: (batch, kv head,
  // head_dim_v, vt_keys), keys contiguous and permuted inside groups of 16.
  struct Fp8Scale {
    const float* ptr = nullptr;
    std::int64_t batch_stride = 0, head_stride = 0, block_stride = 0;
  };
  Fp8Scale q_descale, k_descale, v_descale;
  Fp8Scale q_block_scale, k_block_scale, v_block_scale;
  const void* vt = nullptr;
  int vt_keys = 0;

  int num_sms = 0;  // persistent grid size upper bound

  // The consumers' stamps (hopper/timeline.h), in kernels built with FA3_FWD_TIMELINE and
  // only when the launch gives a buffer: null otherwise.
  std::uint64_t* timeline = nullptr;
  int timeline_capacity = 0;
};

// The rows per block scale of an FP8 call on the GPU (validation refuses others).
inline constexpr int kFp8BlockRows = 128;

}  // namespace fa3::hopper
