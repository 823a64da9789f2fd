// fa3 — how the transposing warps turn a stage of e4m3 V into Vᵀ in shared memory
// (FwdConfig::vt_smem, hopper/fwd_vt_transpose.cuh): which row each lane points
// ldmatrix and stmatrix at, and which bytes each byte_perm picks. Host and device code,
// so that a CPU test can run the same maps through the PTX ISA's fragment rules.
//
// V's stage is (block_n keys, head_dim_v bytes), the head dim contiguous; Vᵀ's is
// (head_dim_v, block_n), the keys contiguous and permuted inside each group of 16 as
// hopper/fp8_layout.h's fp8_vt_key says. A warp moves a chunk of 16 keys x 32 columns at
// a time, in three steps:
//   ldmatrix.x4.trans (b16): matrix j holds keys 8 (j & 1) .. + 7 at columns 16 (j >> 1)
//     .. + 15; lane t gets in register j the 16-bit columns u = t / 4 of keys 2q and
//     2q + 1 (q = t % 4): bytes (key 2q, column 2u), (2q, 2u + 1), (2q + 1, 2u),
//     (2q + 1, 2u + 1).
//   byte_perm of registers 0 and 1 (2 and 3 likewise, 16 columns on): column 2u's bytes
//     of keys 2q, 2q + 1, 2q + 8, 2q + 9, i.e. fp8_vt_key of 4q .. 4q + 3: the four bytes
//     at 4q of Vᵀ's row 2u in the key group; column 2u + 1's likewise.
//   stmatrix.x4 (b16): lane t's register j is row t / 4 of matrix j, bytes 4q .. 4q + 3.
// A matrix of stmatrix thus holds rows 2u (u = 0 .. 7) or 2u + 1; those 8 rows would
// fall two to a bank group under every swizzle of 128-byte rows (the row's index mod 8
// XORs the 16-byte unit: rows 0, 2 .. 14 reach four units). So lanes 16-31 (u >= 4) swap
// which of their two rows goes to which matrix: matrix 0 holds rows 0, 2, 4, 6, 9, 11,
// 13, 15, eight different residues mod 8, and stores in one pass.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace fa3::hopper {

struct VtChunkLane {
  int src_key;         // key (< 16) of the 16-byte row of V this lane's ldmatrix address points at
  int src_col;         // its first column: 0 or 16
  int dst_row;         // row (< 32) of Vᵀ this lane's stmatrix address points at; its bytes are the group's 16 keys
  std::uint32_t sel0;  // byte_perm selector of stmatrix register 0 (2) from ldmatrix registers 0, 1 (2, 3)
  std::uint32_t sel1;  // and of register 1 (3)
};

// Byte selectors: from registers (a, b), bytes 0 and 2 of each (row 2u), or 1 and 3 (row 2u + 1).
inline constexpr std::uint32_t kVtEvenColumn = 0x6420;
inline constexpr std::uint32_t kVtOddColumn = 0x7531;

FA3_HOST_DEVICE constexpr VtChunkLane vt_chunk_lane(int lane) {
  const int matrix = lane / 8, row = lane % 8;
  const bool swapped = row >= 4;  // the address side: matrix `matrix`, row `row`, stored by lanes 4 row ..
  VtChunkLane l{};
  l.src_key = 8 * (matrix & 1) + row;
  l.src_col = 16 * (matrix >> 1);
  l.dst_row = 16 * (matrix >> 1) + 2 * row + ((matrix & 1) ^ (swapped ? 1 : 0));
  const bool data_swapped = lane >= 16;  // the data side: this lane's u = lane / 4 >= 4
  l.sel0 = data_swapped ? kVtOddColumn : kVtEvenColumn;
  l.sel1 = data_swapped ? kVtEvenColumn : kVtOddColumn;
  return l;
}

// A V whose keys are contiguous (V_colmajor) lands as Vᵀ with its keys in order: each
// 16-byte unit (16 keys of one column) is permuted in place into fp8_vt_key's order, word
// w from words (w / 2, w / 2 + 2) of the unit: bytes 0, 1 of each (w even) or 2, 3.
inline constexpr std::uint32_t kVtLowPairs = 0x5410;
inline constexpr std::uint32_t kVtHighPairs = 0x7632;

// Keys 2q, 2q + 1, 2q + 8, 2q + 9 of a 16-key group sit in word q of its Vᵀ unit (bytes 4q ..
// 4q + 3, fp8_vt_key). The mask of those bytes whose keys are below `valid` (keys past a
// sequence's end are cleared: a varlen call's next rows may hold NaN).
FA3_HOST_DEVICE constexpr std::uint32_t vt_word_key_mask(int q, int valid) {
  std::uint32_t mask = 0;
  for (int b = 0; b < 4; ++b) {
    const int key = 2 * q + (b & 1) + 8 * (b >> 1);
    if (key < valid) mask |= 0xffu << (8 * b);
  }
  return mask;
}

}  // namespace fa3::hopper
