// fa3 — the scales of an FP8 forward tile (fa3/attention.h's Fp8Args), as the consumers
// apply them:
//   q and k's per-tile factors multiply S. q's (descale times the block scale of the
//   tile's 128 rows) and k's descale are the same for every key block of a tile, so they
//   fold into the softmax scale; k's block scale changes with the key block and
//   multiplies S before the mask and the softmax (one multiply per score), or with the
//   lean FP8 softmax (hopper/fwd_config.h) enters the softmax's max and exponent.
//   v's block scale also changes with the key block. P is not scaled by it: e4m3's range
//   is taken by the 2^8 shift of P (hopper/softmax.cuh), and a scale above 1 would
//   saturate it. O is kept in units of the last key block's v scale instead: before a
//   block's P·V is added, O is multiplied by v(previous) / v(this), which joins the
//   online softmax's rescale of O (run every block in the FP8 kernels), and at the end O
//   is multiplied by the last block's scale times v's descale, with 1/sum. The block
//   scales are then required to be finite and > 0, as fp8::quantize writes them.
// The non-FP8 kernels use NoScales, whose factors are compile-time ones.
#pragma once

#include "hopper/fwd_params.h"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

struct NoScales {
  static constexpr bool kOn = false;
  __device__ NoScales(const FwdParams&, TileCoord) {}
  __device__ float qk() const { return 1.f; }
  __device__ bool per_block() const { return false; }
  __device__ float k_block(int) const { return 1.f; }
  __device__ float v_block(int) const { return 1.f; }
  __device__ float v_out(float) const { return 1.f; }
};

// Tiles whose query or key blocks do not divide the scale's rows (kFp8BlockRows) cannot
// take block scales; the dispatcher runs calls with block scales on other tiles
// (FwdKernelEntry::takes_fp8_block_scales), and these read none.
template <int kBlockM, int kBlockN>
struct Fp8TileScales {
  static constexpr bool kBlockScales = kFp8BlockRows % kBlockM == 0 && kFp8BlockRows % kBlockN == 0;
  static constexpr bool kOn = true;
  float qk_factor = 1.f;  // q's scale of the tile times k's descale
  float v_descale = 1.f;
  const float* k_blocks = nullptr;  // k's and v's block scales of the tile's (batch, kv head), or null
  const float* v_blocks = nullptr;
  std::int64_t k_block_stride = 0, v_block_stride = 0;

  __device__ Fp8TileScales(const FwdParams& p, TileCoord tile) {
    const int head_kv = tile.head / (p.nheads_q / p.nheads_kv);
    float q = at(p.q_descale, tile.batch, head_kv);
    if constexpr (kBlockScales) {
      q *= at(p.q_block_scale, tile.batch, tile.head, tile.m_block * kBlockM / kFp8BlockRows);
    }
    qk_factor = q * at(p.k_descale, tile.batch, head_kv);
    v_descale = at(p.v_descale, tile.batch, head_kv);
    if (kBlockScales && p.k_block_scale.ptr != nullptr) {
      k_blocks =
          p.k_block_scale.ptr + tile.batch * p.k_block_scale.batch_stride + head_kv * p.k_block_scale.head_stride;
      v_blocks =
          p.v_block_scale.ptr + tile.batch * p.v_block_scale.batch_stride + head_kv * p.v_block_scale.head_stride;
      k_block_stride = p.k_block_scale.block_stride;
      v_block_stride = p.v_block_scale.block_stride;
    }
  }

  __device__ float qk() const { return qk_factor; }
  // Whether k and v have block scales, which change from one key block to the next.
  __device__ bool per_block() const { return v_blocks != nullptr; }
  // Key block n's block scales (1 without block scales).
  __device__ float k_block(int n) const {
    return k_blocks == nullptr ? 1.f : __ldg(k_blocks + n * kBlockN / kFp8BlockRows * k_block_stride);
  }
  __device__ float v_block(int n) const {
    return v_blocks == nullptr ? 1.f : __ldg(v_blocks + n * kBlockN / kFp8BlockRows * v_block_stride);
  }
  // The factor of O at the end, O being in units of v_last (the last block's v scale).
  __device__ float v_out(float v_last) const { return v_descale * v_last; }

 private:
  // Scale (batch, head, block) of one of Fp8Args' tensors (1 when not given).
  __device__ static float at(const FwdParams::Fp8Scale& s, int batch, int head, int block = 0) {
    return s.ptr == nullptr ? 1.f
                            : __ldg(s.ptr + batch * s.batch_stride + head * s.head_stride + block * s.block_stride);
  }
};

}  // namespace fa3::hopper
