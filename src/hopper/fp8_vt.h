// fa3 — Vᵀ for the FP8 forward: e4m3 V (batch, seqlen_k, nheads_kv, head_dim_v), any
// strides (its head dim contiguous, or its keys: FlashAttention-3's V_colmajor), rewritten as (batch, nheads_kv, head_dim_v, vt_keys) with the
// keys contiguous, since FP8 wgmma reads its B operand K-major only. Inside each group of
// 16 keys, column k holds key fp8_vt_key(k) (hopper/fp8_layout.h), the order in which
// P's registers reach the P·V GEMM; keys past seqlen_k, up to vt_keys, are zeros.
//
// A varlen call's packed V (total_k, nheads_kv, head_dim_v) becomes (nheads_kv,
// head_dim_v, vt_keys), one batch entry holding the sequences one after another, each
// from its own aligned start and followed by zeros (fp8_layout.h's fp8_vt_seq_start):
// about total_k + 272 · batch keys, where one entry per sequence of max_seqlen_k keys
// would take batch · max_seqlen_k.
//
// It is one pass over V (read once, written once) before the attention kernel: for
// seqlen_q = seqlen_k = L and head dim d that is 2·L·d bytes per head against 4·L²·d
// FLOPs, under 1 % of the kernel's time from about 1k tokens on; at short sequences the
// extra launch and pass weigh more.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "api/problem.h"
#include "hopper/fwd_params.h"

namespace fa3::hopper {

// Keys of Vᵀ per row for a fixed-length call's seqlen_k (a multiple of kFp8VtKeyAlign).
int fp8_vt_keys(int seqlen_k);

// Keys of Vᵀ per row for a varlen call of `batch` sequences packed in total_k rows: room
// for every sequence's start and zeros (fp8_layout.h), a multiple of kFp8VtKeyAlign.
std::int64_t fp8_vt_varlen_keys(std::int64_t total_k, std::int64_t batch);

// Keys of Vᵀ per row for a call, fixed-length or varlen.
std::int64_t fp8_vt_keys(const Problem& p);

// Bytes of the Vᵀ buffer of a call (its batch, nheads_kv, head_dim_v and keys).
std::size_t fp8_vt_bytes(const Problem& p);

// Writes Vᵀ of p.v into `vt` (fp8_vt_bytes of the call, 16-byte aligned) on `stream`; a
// varlen call's from p.cu_seqlens_k and p.seqused_k, with p.seqlen_k its max_seqlen_k.
cudaError_t launch_fp8_transpose_v(const FwdParams& p, void* vt, cudaStream_t stream);

}  // namespace fa3::hopper
