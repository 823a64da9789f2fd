// fa3 — how the FP8 forward hands P from the Q·Kᵀ accumulator to the P·V GEMM without
// moving data between threads, and the key order of Vᵀ that this needs.
//
// The FP8 wgmma (m64nNk32, e4m3) reads its B operand K-major only, so P·V reads V
// transposed, keys contiguous (hopper/fp8_vt.cu writes Vᵀ), and P from registers as its
// A operand. The two register layouts, from the PTX ISA's wgmma fragment figures
// (q = lane % 4, r = 16 * warp + lane / 4 the thread's first row):
//   f32 accumulator of m64nN: value j + 2i + 4g is row r + 8i, column 8g + 2q + j
//     (j, i in {0, 1}; g < N/8);
//   e4m3 A operand of m64nNk32, from registers: 16 values, 4 bytes to a register;
//     value b + 4i + 8h is row r + 8i, column k = 16h + 4q + b (b < 4; i, h < 2).
// For one 32-key slice of S, a thread holds in row r + 8i the keys {2q, 2q+1} + 8g'
// (g' < 4); the A operand wants k in {4q .. 4q+3} + 16h. Both sets have 8 members and
// differ only in which keys: so A's byte b of half h is filled from the accumulator's
// key 16h + 2q + (b & 1) + 8 (b >> 1) of the same row (fp8_p_source), and the GEMM then
// computes Σ_k P[key(k)] · Vᵀ[k] instead of Σ_key P[key] · Vᵀ[key]. Laying Vᵀ out with
// column k holding key(k) (fp8_vt_key, a permutation inside each 16-key group, applied by
// the transpose that writes Vᵀ anyway) makes the two sums equal. The conversion is then
// four cvt.e4m3x2 per register pair and no shuffle, where the alternative, keys in
// order, takes byte permutes and two shuffles per register (FlashAttention-3's way).
#pragma once

#include "common/host_device.h"

namespace fa3::hopper {

// The key, within its 16-key group, that column k (< 16) of the group holds in Vᵀ.
FA3_HOST_DEVICE constexpr int fp8_vt_key(int k) { return 2 * (k / 4) + (k & 1) + 8 * ((k >> 1) & 1); }

// The accumulator value (index within one 32-key slice's 16) that A operand value `a`
// (index within the slice's 16, b + 4i + 8h) is converted from.
FA3_HOST_DEVICE constexpr int fp8_p_source(int a) {
  const int b = a % 4, i = (a / 4) % 2, h = a / 8;
  return (b & 1) + 2 * i + 4 * (2 * h + (b >> 1));
}

// Vᵀ's keys are padded to a whole number of these (zeros past seqlen_k).
inline constexpr int kFp8VtKeyAlign = 128;

// A varlen call's Vᵀ holds its sequences one after another along the keys: sequence b
// from column fp8_vt_seq_start(cu_seqlens_k[b], b), a multiple of 16 (16 bytes), its
// 16-key groups counted from there. Past its used keys (seqused_k[b], or all of its
// keys) come kFp8VtTail zero columns, so that its last key block, at most that wide,
// reads zeros there and never the next sequence's keys: rounding the start up to 16
// keys takes up to 15 columns of the kFp8VtSeqPad each sequence adds.
inline constexpr int kFp8VtTail = 256;
inline constexpr int kFp8VtSeqPad = kFp8VtTail + 16;
FA3_HOST_DEVICE constexpr long long fp8_vt_seq_start(long long offset_k, long long batch) {
  return (offset_k + 15) / 16 * 16 + batch * kFp8VtSeqPad;
}

}  // namespace fa3::hopper
