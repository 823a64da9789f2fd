// fa3 — the FP8 forward's transpose of V in shared memory (FwdConfig::vt_smem): two or
// three warps of the producer warpgroup (Traits::kTransposeWarps) turn each stage of V,
// as TMA lands it, into the Vᵀ stage the P·V GEMM reads (FP8 wgmma reads its B operand
// K-major only), so that an FP8 call needs no pass over V before the kernel and no
// workspace.
//
// Two rings: the producer's TMA fills V's (v_landed_pipe), whose stages these warps
// release once read; they fill Vᵀ's (v_pipe), which the consumers wait for and release
// as they would TMA's. Each thread fences its stores for the async proxy and arrives on
// the Vᵀ stage itself. Per stage, the producer's slot tells how many of the block's keys
// are the sequence's (the rest are cleared), or -1: no more blocks.
//
// Row-major V (head dim contiguous) goes through ldmatrix.trans, byte_perm and stmatrix,
// 16 keys x 32 columns a warp instruction each (hopper/fp8_vt_smem.h); a V whose keys are
// contiguous (V_colmajor) lands as Vᵀ with its keys in order and only has each 16-byte
// unit's bytes permuted.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <type_traits>

#include "hopper/arch/ptx.cuh"
#include "hopper/fp8_vt_smem.h"
#include "hopper/fwd_config.h"
#include "hopper/fwd_params.h"
#include "hopper/pipeline.cuh"

namespace fa3::hopper {

template <class Traits>
struct FwdVtTranspose {
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  using Pipeline = typename Traits::Pipeline;
  using State = StageState<Traits::kStages>;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kDV = Traits::kHeadDimV;
  static constexpr int kWarps = Traits::kTransposeWarps;
  static constexpr int kThreads = Traits::kTransposeThreads;
  static constexpr int kKeyGroups = kBlockN / 16;
  // Key groups whose loads a warp has in flight at once. With three warps (the tiles
  // whose producer warpgroup has no O store warp) four groups' fragments spilled within
  // the producer's register budget (head dim 256, 128x128: 368 / 452 bytes); two spill
  // 80 / 148 and ran up to 6 % faster (4 % at most lengths from 2k keys) on an H100,
  // though each ldmatrix then waits for the one before it (docs/perf-log.md).
  static constexpr int kBatch = kKeyGroups % 4 == 0 && kWarps == 2 ? 4 : 2;
  // Row-major V moves in whole chunks (columns 32 c ..) a warp, or with kFp8VtPieces in
  // pieces of kBatch key groups of one chunk, dealt to the warps in turn: warp w takes
  // pieces w, w + kWarps, ... A stage takes as long as the longest share: eight chunks to
  // three warps (head dim 256) are 3, 3 and 2 chunks of four pieces, or 11, 11 and 10
  // pieces. Pieces are dealt only where whole chunks do not split evenly between the
  // warps: elsewhere they balance nothing (on an H100 they lost 3-6 % at head dim 192
  // causal, whose 6 chunks go 2, 2, 2, when their offsets were computed per piece).
  static constexpr bool kDealPieces = kFp8VtPieces && kDV / 32 % kWarps != 0;
  static_assert(kKeyGroups % kBatch == 0, "a chunk's key groups split into whole pieces");
  static constexpr int kPiecesPerChunk = kKeyGroups / kBatch;
  static constexpr int kPieces = kDV / 32 * kPiecesPerChunk;
  static constexpr int kPiecesPerWarp = (kPieces + kWarps - 1) / kWarps;
  static_assert(kBlockN % 32 == 0 && kDV % 32 == 0, "V's stage is moved in chunks of 16 keys x 32 columns, in pairs");
  static_assert(cute::sizeof_bits_v<Element> == 8, "the transpose moves e4m3 bytes");

  // `thread`: index among the transposing threads.
  __device__ static void run(const FwdParams& p, SharedStorage& smem, Pipeline& landed_pipe, Pipeline& vt_pipe,
                             int thread) {
    // Uniform for the call: which layout V lands in.
    const bool keys_contiguous = p.v_col_stride != 1;
    // With pieces, each warp branches to its own copy of the loop: on a uniform index.
    const int warp = kDealPieces ? __shfl_sync(0xffffffffu, thread / 32, 0) : thread / 32;
    using Addresses = std::conditional_t<kDealPieces, LaneAddresses, ChunkAddresses>;
    const Addresses addresses(smem, warp, thread % 32);
    State landed;
    State vt = Pipeline::producer_start();
    for (;;) {
      landed_pipe.consumer_wait_for_data(landed);
      const int keys = smem.v_landed_keys[landed.index];
      if (keys < 0) break;
      vt_pipe.producer_wait(vt);
      // The waits and arrivals are not compiler memory barriers: the stage's loads and
      // stores stay between them.
      arch::compiler_barrier();
      if (keys_contiguous) {
        permute_units(smem, landed.index, vt.index, keys, thread);
      } else if (keys < kBlockN) {
        transpose<true>(addresses, landed.index, vt.index, keys, thread % 32);
      } else {
        transpose<false>(addresses, landed.index, vt.index, keys, thread % 32);
      }
      arch::compiler_barrier();
      landed_pipe.consumer_release_each(landed);
      cutlass::arch::fence_view_async_shared();
      vt_pipe.producer_commit(vt);
      landed.advance();
      vt.advance();
    }
  }

  // Byte offsets in a stage, from the two layouts (V's (block_n, head_dim_v), Vᵀ's
  // (head_dim_v, block_n)); each stage takes kStageBytes, and both rings start 1024-byte
  // aligned.
  using LayoutV = decltype(cute::take<0, 2>(typename Traits::SmemLayoutVRows{}));
  using LayoutVt = decltype(cute::take<0, 2>(typename Traits::SmemLayoutVt{}));
  static constexpr int kStageBytes = kBlockN * kDV;
  __host__ __device__ static constexpr int src_offset(int key, int col) { return LayoutV{}(key, col); }
  __host__ __device__ static constexpr int dst_offset(int row, int key) { return LayoutVt{}(row, key); }

  // The inner loop's addresses without the layouts' arithmetic (a CPU test checks both
  // against them at every row, column and key group of each FP8 configuration):
  //   V: 16 keys on are whole swizzle atoms further, kSrcGroupStride bytes;
  //   Vᵀ: key group g of a row sits at (its key 0 ^ dst_group_xor(g)) + dst_group_add(g):
  //     within an atom's row of kVtAtomBytes the swizzle XORs the 16-byte unit with the
  //     row's index, and further key groups are whole atoms away.
  static constexpr int kSrcGroupStride = src_offset(16, 0) - src_offset(0, 0);
  // The bytes of a swizzle atom's row: Vᵀ's (`vt`, along the keys) or V's (along the
  // columns), the first width at which the next byte lies outside the row.
  __host__ __device__ static constexpr int atom_bytes(bool vt) {
    const int limit = vt ? kBlockN : kDV;
    int w = vt ? 16 : 32;
    while (w < limit && (vt ? dst_offset(0, w) : src_offset(0, w)) == w) w *= 2;
    return w;
  }
  static constexpr int kVtAtomBytes = atom_bytes(true);
  static constexpr unsigned kVtAtomStride = kVtAtomBytes < kBlockN ? dst_offset(0, kVtAtomBytes) - dst_offset(0, 0) : 0;
  __host__ __device__ static constexpr std::uint32_t dst_group_xor(unsigned g) { return 16 * g % kVtAtomBytes; }
  __host__ __device__ static constexpr std::uint32_t dst_group_add(unsigned g) {
    return 16 * g / kVtAtomBytes * kVtAtomStride;
  }
  static_assert(kStageBytes % 1024 == 0, "stages keep the rings' 1024-byte alignment, which the XOR relies on");

  // Chunk c (columns 32 c ..) from a lane's addresses in chunk 0 (a CPU test checks them
  // at every lane and chunk of each FP8 configuration):
  //   V: 32 columns on within a swizzle atom's row of kSrcAtomBytes (the column's 16-byte
  //     unit XORed, as the swizzle XORs it with the key: the two commute), whole atoms
  //     further on;
  //   Vᵀ: 32 rows further on.
  static constexpr int kSrcAtomBytes = atom_bytes(false);
  static constexpr unsigned kSrcAtomStride = kSrcAtomBytes < kDV ? src_offset(0, kSrcAtomBytes) - src_offset(0, 0) : 0;
  static constexpr unsigned kDstChunkStride = dst_offset(32, 0) - dst_offset(0, 0);
  __host__ __device__ static constexpr std::uint32_t src_chunk_xor(unsigned c) { return 32 * c % kSrcAtomBytes; }
  __host__ __device__ static constexpr std::uint32_t src_chunk_add(unsigned c) {
    return 32 * c / kSrcAtomBytes * kSrcAtomStride;
  }
  __host__ __device__ static constexpr std::uint32_t dst_chunk_add(unsigned c) { return c * kDstChunkStride; }

 private:
  __device__ __forceinline__ static std::uint32_t smem_address(const void* p) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
  }

  // Key groups g0 .. g0 + kBatch - 1 of one chunk: `src` is the lane's ldmatrix address of
  // group g0, `dst` its stmatrix address of the chunk's group 0. kMasked: a block with
  // keys past the sequence's (`keys`).
  template <bool kMasked>
  __device__ __forceinline__ static void move_batch(std::uint32_t src, std::uint32_t dst, unsigned g0, int keys,
                                                    int lane) {
    const int q = lane % 4;
    const std::uint32_t sel0 = vt_chunk_lane(lane).sel0, sel1 = vt_chunk_lane(lane).sel1;
    // The ldmatrix and stmatrix statements keep their order (asm volatile, so that none
    // moves past the stage's waits).
    std::uint32_t r[kBatch][4];
    CUTE_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      asm volatile("ldmatrix.sync.aligned.x4.trans.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];"
                   : "=r"(r[j][0]), "=r"(r[j][1]), "=r"(r[j][2]), "=r"(r[j][3])
                   : "r"(src + j * kSrcGroupStride));
    }
    // Left alone, ptxas permutes and stores each group before it loads the next: one
    // ldmatrix in flight in the producer's 24 registers, its latency paid at every group.
    // Dealt in pieces, the first group's permutes wait for the last group's load, so
    // that the batch's loads issue together (twice the registers for fragments).
    if constexpr (kDealPieces && kBatch > 1) r[0][0] = arch::ordered_after(r[0][0], r[kBatch - 1][3]);
    CUTE_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      const unsigned g = g0 + j;
      std::uint32_t s0 = __byte_perm(r[j][0], r[j][1], sel0);
      std::uint32_t s1 = __byte_perm(r[j][0], r[j][1], sel1);
      std::uint32_t s2 = __byte_perm(r[j][2], r[j][3], sel0);
      std::uint32_t s3 = __byte_perm(r[j][2], r[j][3], sel1);
      if constexpr (kMasked) {
        // Every register of a lane holds the same four keys of the group.
        const std::uint32_t mask = vt_word_key_mask(q, keys - 16 * static_cast<int>(g));
        s0 &= mask;
        s1 &= mask;
        s2 &= mask;
        s3 &= mask;
      }
      asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"((dst ^ dst_group_xor(g)) +
                                                                                            dst_group_add(g)),
                   "r"(s0), "r"(s1), "r"(s2), "r"(s3));
    }
  }

  // Row-major V, in pieces or in whole chunks (kDealPieces).
  template <bool kMasked, class Addresses>
  __device__ static void transpose(const Addresses& addresses, int landed_stage, int vt_stage, int keys, int lane) {
    if constexpr (kDealPieces) {
      transpose_pieces<kMasked>(addresses, landed_stage, vt_stage, keys, lane);
    } else {
      transpose_chunks<kMasked>(addresses, landed_stage, vt_stage, keys, lane);
    }
  }

  // Whole chunks a warp: warp w takes the chunks c = w, w + kWarps, ..., each over the
  // block's key groups. A lane's addresses of its chunks in the first stages, computed
  // once (the layouts' arithmetic is a few instructions per address).
  static constexpr int kChunksPerWarp = (kDV / 32 + kWarps - 1) / kWarps;
  struct ChunkAddresses {
    int warp;
    std::uint32_t src[kChunksPerWarp];
    std::uint32_t dst[kChunksPerWarp];

    // Whether the warp's i-th chunk row exists (kDV / 32 need not divide by kWarps).
    __device__ bool owns(int i) const { return warp + i * kWarps < kDV / 32; }

    __device__ ChunkAddresses(SharedStorage& smem, int warp_, int lane) : warp(warp_) {
      const VtChunkLane l = vt_chunk_lane(lane);
      CUTE_UNROLL
      for (int i = 0; i < kChunksPerWarp; ++i) {
        const int c = warp + i * kWarps;
        src[i] = smem_address(smem.v_landed) + src_offset(l.src_key, 32 * c + l.src_col);
        dst[i] = smem_address(smem.v) + dst_offset(32 * c + l.dst_row, 0);
      }
    }
  };

  template <bool kMasked>
  __device__ static void transpose_chunks(const ChunkAddresses& chunks, int landed_stage, int vt_stage, int keys,
                                          int lane) {
    CUTE_UNROLL
    for (int c = 0; c < kChunksPerWarp; ++c) {
      if (!chunks.owns(c)) continue;
      const std::uint32_t src = chunks.src[c] + landed_stage * kStageBytes;
      const std::uint32_t dst = chunks.dst[c] + vt_stage * kStageBytes;
      CUTE_UNROLL
      for (int g0 = 0; g0 < kKeyGroups; g0 += kBatch) {
        move_batch<kMasked>(src + g0 * kSrcGroupStride, dst, g0, keys, lane);
      }
    }
  }

  // Pieces dealt in turn (kDealPieces). A lane's addresses in the first piece; each
  // warp runs its own copy of the loop (kWarp a template argument), so that a piece's
  // offsets from them are constants: an XOR and immediate offsets in the ldmatrix and
  // stmatrix. The kernel is bound by the SM's instruction issue, which the transposing
  // warps share with the consumers' softmax: offsets computed from a runtime warp index
  // (about 15 uniform instructions a piece) doubled the transpose's instructions and
  // cost what its shorter chains gained (docs/perf-log.md).
  struct LaneAddresses {
    int warp;  // uniform
    std::uint32_t src;
    std::uint32_t dst;

    __device__ LaneAddresses(SharedStorage& smem, int warp_, int lane) : warp(warp_) {
      const VtChunkLane l = vt_chunk_lane(lane);
      src = smem_address(smem.v_landed) + src_offset(l.src_key, l.src_col);
      dst = smem_address(smem.v) + dst_offset(l.dst_row, 0);
    }
  };

  template <bool kMasked>
  __device__ static void transpose_pieces(const LaneAddresses& lanes, int landed_stage, int vt_stage, int keys,
                                          int lane) {
    const std::uint32_t src = lanes.src + landed_stage * kStageBytes;
    const std::uint32_t dst = lanes.dst + vt_stage * kStageBytes;
    pieces_of_warp<kMasked, 0>(lanes.warp, src, dst, keys, lane);
  }

  template <bool kMasked, int kWarp>
  __device__ __forceinline__ static void pieces_of_warp(int warp, std::uint32_t src, std::uint32_t dst, int keys,
                                                        int lane) {
    if constexpr (kWarp < kWarps) {
      if (warp != kWarp) return pieces_of_warp<kMasked, kWarp + 1>(warp, src, dst, keys, lane);
      CUTE_UNROLL
      for (int piece = kWarp; piece < kPieces; piece += kWarps) {
        const unsigned chunk = piece / kPiecesPerChunk, g0 = piece % kPiecesPerChunk * kBatch;
        // The rings start 1024-byte aligned and the XORs stay below 128: they act on the
        // offset inside the stage alone.
        move_batch<kMasked>(((src ^ src_chunk_xor(chunk)) + src_chunk_add(chunk)) + g0 * kSrcGroupStride,
                            dst + dst_chunk_add(chunk), g0, keys, lane);
      }
    }
  }

  // V_colmajor: the stage holds Vᵀ with keys in order, in Vᵀ's own layout; each thread
  // permutes whole 16-byte units (16 keys of one column) into Vᵀ's stage.
  __device__ static void permute_units(SharedStorage& smem, int landed_stage, int vt_stage, int keys, int thread) {
    const char* in = reinterpret_cast<const char*>(smem.v_landed) + landed_stage * kStageBytes;
    char* out = reinterpret_cast<char*>(smem.v) + vt_stage * kStageBytes;
    constexpr int kUnits = kDV * kKeyGroups;
#pragma unroll 2
    for (int u = thread; u < kUnits; u += kThreads) {
      // Neighbouring threads take neighbouring units of a row: 8 of them cover 128 bytes.
      const int g = u % kKeyGroups, row = u / kKeyGroups;
      const int offset = dst_offset(row, 16 * g);
      const uint4 w = *reinterpret_cast<const uint4*>(in + offset);
      uint4 o;
      o.x = __byte_perm(w.x, w.z, kVtLowPairs);
      o.y = __byte_perm(w.x, w.z, kVtHighPairs);
      o.z = __byte_perm(w.y, w.w, kVtLowPairs);
      o.w = __byte_perm(w.y, w.w, kVtHighPairs);
      if (keys < kBlockN) {
        const int valid = keys - 16 * g;
        o.x &= vt_word_key_mask(0, valid);
        o.y &= vt_word_key_mask(1, valid);
        o.z &= vt_word_key_mask(2, valid);
        o.w &= vt_word_key_mask(3, valid);
      }
      *reinterpret_cast<uint4*>(out + offset) = o;
    }
  }
};

}  // namespace fa3::hopper
