// The FP8 forward's transpose of V in shared memory (hopper/fwd_vt_transpose.cuh,
// hopper/fp8_vt_smem.h), run on the CPU: its address shortcuts against CuTe's layouts of
// the two stages, and whole stages moved by the lanes' ldmatrix / byte_perm / stmatrix
// roles under the PTX ISA's fragment rules, against Vᵀ as hopper/fp8_layout.h orders it;
// every ldmatrix and stmatrix matrix in one pass of the shared-memory banks.
#include <gtest/gtest.h>

#include <cutlass/numeric_types.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hopper/fp8_layout.h"
#include "hopper/fp8_vt_smem.h"
#include "hopper/fwd_config.h"
#include "hopper/fwd_traits.cuh"
#include "hopper/fwd_vt_transpose.cuh"

namespace fa3::hopper {
namespace {

template <int kHeadDim, int kBlockN>
struct VtCase {
  static constexpr FwdConfig kCfg = fwd_config(kHeadDim, kHeadDim, FwdTile{128, kBlockN}, 1, true);
  using Traits = FwdTraits<cutlass::float_e4m3_t, kHeadDim, kHeadDim, kCfg, cutlass::bfloat16_t>;
  using T = FwdVtTranspose<Traits>;
  static std::string name() { return "hdim " + std::to_string(kHeadDim) + ", 128x" + std::to_string(kBlockN); }
};

// Calls `check` with each FP8 configuration's VtCase as its template argument.
template <class Check>
void for_every_case(Check check) {
  check.template operator()<VtCase<64, 128>>();
  check.template operator()<VtCase<96, 128>>();
  check.template operator()<VtCase<128, 128>>();
  check.template operator()<VtCase<128, 192>>();
  check.template operator()<VtCase<128, 224>>();
  check.template operator()<VtCase<192, 128>>();
  check.template operator()<VtCase<192, 160>>();
  check.template operator()<VtCase<256, 64>>();
  check.template operator()<VtCase<256, 128>>();
}

// __byte_perm: byte i of the result is byte (sel >> 4i) & 7 of {b, a} (a the low word).
std::uint32_t byte_perm(std::uint32_t a, std::uint32_t b, std::uint32_t sel) {
  const std::uint64_t x = (std::uint64_t{b} << 32) | a;
  std::uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<std::uint32_t>((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}

// Eight 16-byte rows (one ldmatrix / stmatrix matrix) in one pass: distinct bank groups.
bool one_pass(const std::vector<int>& rows) {
  std::set<int> groups;
  for (int a : rows) groups.insert(a / 16 % 8);
  return groups.size() == rows.size();
}

template <class Case>
void expect_addresses_follow_the_layouts() {
  using Traits = typename Case::Traits;
  using T = typename Case::T;
  SCOPED_TRACE(Case::name());
  using namespace cute;
  ASSERT_TRUE(Case::kCfg.vt_smem);
  // The offsets the transpose computes are those of the kernel's tensors over the stages.
  Tensor sV = make_tensor(make_smem_ptr(static_cast<std::uint8_t*>(nullptr)), typename Traits::SmemLayoutVRows{});
  Tensor sVt = make_tensor(make_smem_ptr(static_cast<std::uint8_t*>(nullptr)), typename Traits::SmemLayoutVt{});
  const auto at = [](const auto& ref) { return static_cast<int>(reinterpret_cast<std::uintptr_t>(&ref)); };
  for (int key = 0; key < Traits::kBlockN; ++key) {
    for (int col = 0; col < Traits::kHeadDimV; col += 16) {
      ASSERT_EQ(T::src_offset(key, col), at(sV(key, col, 0))) << "V key " << key << " col " << col;
      ASSERT_EQ(T::src_offset(key, col) + T::kStageBytes, at(sV(key, col, 1)));
      ASSERT_EQ(T::dst_offset(col, key / 16 * 16), at(sVt(col, key / 16 * 16, 0)));
    }
  }
  for (int row = 0; row < Traits::kHeadDimV; ++row) {
    for (int g = 0; g < Traits::kBlockN / 16; ++g) {
      ASSERT_EQ(T::dst_offset(row, 16 * g), at(sVt(row, 16 * g, 0))) << "Vt row " << row << " group " << g;
      ASSERT_EQ(T::dst_offset(row, 16 * g), (T::dst_offset(row, 0) ^ T::dst_group_xor(g)) + T::dst_group_add(g))
          << "Vt row " << row << " group " << g;
      ASSERT_EQ(T::dst_offset(row, 16 * g) + T::kStageBytes, at(sVt(row, 16 * g, 1)));
    }
  }
  // A chunk's addresses from a lane's in chunk 0.
  for (int lane = 0; lane < 32; ++lane) {
    const VtChunkLane l = vt_chunk_lane(lane);
    for (int c = 0; c < Traits::kHeadDimV / 32; ++c) {
      ASSERT_EQ(T::src_offset(l.src_key, 32 * c + l.src_col),
                (T::src_offset(l.src_key, l.src_col) ^ T::src_chunk_xor(c)) + T::src_chunk_add(c))
          << "V lane " << lane << " chunk " << c;
      ASSERT_EQ(T::dst_offset(32 * c + l.dst_row, 0), T::dst_offset(l.dst_row, 0) + T::dst_chunk_add(c))
          << "Vt lane " << lane << " chunk " << c;
    }
  }
  for (int key = 0; key < 16; ++key) {
    for (int col = 0; col < Traits::kHeadDimV; col += 16) {
      for (int g = 0; g < Traits::kBlockN / 16; ++g) {
        ASSERT_EQ(T::src_offset(16 * g + key, col), T::src_offset(key, col) + g * T::kSrcGroupStride)
            << "V key " << key << " col " << col << " group " << g;
      }
    }
  }
}

// Key group g of one chunk through the lanes' ldmatrix / byte_perm / stmatrix roles under
// the PTX ISA's fragment rules, at the lanes' addresses `src` (group g's rows of V) and
// `dst` (its Vᵀ rows). `conflicts` counts matrices that would take more than one pass of
// the banks.
void move_group(const std::vector<std::uint8_t>& v, std::vector<std::uint8_t>& vt, int keys, int block_n, int g,
                const int* src, const int* dst, int* conflicts) {
  for (int j = 0; j < 4; ++j) {
    std::vector<int> ld(src + 8 * j, src + 8 * j + 8), st(dst + 8 * j, dst + 8 * j + 8);
    *conflicts += !one_pass(ld) + !one_pass(st);
  }
  // ldmatrix.trans: lane t's register j holds 16-bit column t / 4 of rows 2 (t % 4) and
  // 2 (t % 4) + 1 of matrix j, whose row i is the 16 bytes at lane 8 j + i's address.
  std::uint32_t s[32][4];
  for (int lane = 0; lane < 32; ++lane) {
    const int u = lane / 4, q = lane % 4;
    std::uint32_t r[4];
    for (int j = 0; j < 4; ++j) {
      const std::uint8_t* lo = &v[src[8 * j + 2 * q]];
      const std::uint8_t* hi = &v[src[8 * j + 2 * q + 1]];
      r[j] = lo[2 * u] | lo[2 * u + 1] << 8 | hi[2 * u] << 16 | static_cast<std::uint32_t>(hi[2 * u + 1]) << 24;
    }
    const VtChunkLane l = vt_chunk_lane(lane);
    s[lane][0] = byte_perm(r[0], r[1], l.sel0);
    s[lane][1] = byte_perm(r[0], r[1], l.sel1);
    s[lane][2] = byte_perm(r[2], r[3], l.sel0);
    s[lane][3] = byte_perm(r[2], r[3], l.sel1);
    if (keys < block_n) {
      for (std::uint32_t& w : s[lane]) w &= vt_word_key_mask(q, keys - 16 * g);
    }
  }
  // stmatrix: lane t's register j is bytes 4 (t % 4) .. of row t / 4 of matrix j, whose
  // row i goes to lane 8 j + i's address.
  for (int lane = 0; lane < 32; ++lane) {
    for (int j = 0; j < 4; ++j) {
      std::uint8_t* row = &vt[dst[8 * j + lane / 4]];
      for (int b = 0; b < 4; ++b) row[4 * (lane % 4) + b] = static_cast<std::uint8_t>(s[lane][j] >> (8 * b));
    }
  }
}

// One stage of V (random bytes, `keys` of them the sequence's) through the transpose's
// lanes as the kernel runs them, its warps dealt whole chunks or (`pieces`,
// kFp8VtPieces) pieces; returns the Vᵀ stage.
template <class Case>
std::vector<std::uint8_t> transpose_stage(const std::vector<std::uint8_t>& v, int keys, bool pieces, int* conflicts) {
  using T = typename Case::T;
  constexpr int kBN = Case::Traits::kBlockN;
  std::vector<std::uint8_t> vt(T::kStageBytes, 0xa5);
  int src[32], dst[32];
  for (int warp = 0; warp < T::kWarps; ++warp) {
    if (pieces) {
      // Warp w takes pieces w, w + kWarps, ...; a piece is kBatch key groups of one
      // chunk. The kernel's arithmetic: the lane's addresses in the first piece, the
      // piece's chunk and first group, the group within the piece.
      for (int piece = warp; piece < T::kPieces; piece += T::kWarps) {
        const int c = piece / T::kPiecesPerChunk, g0 = piece % T::kPiecesPerChunk * T::kBatch;
        for (int g = g0; g < g0 + T::kBatch; ++g) {
          for (int lane = 0; lane < 32; ++lane) {
            const VtChunkLane l = vt_chunk_lane(lane);
            src[lane] = static_cast<int>((T::src_offset(l.src_key, l.src_col) ^ T::src_chunk_xor(c)) +
                                         T::src_chunk_add(c) + g0 * T::kSrcGroupStride + (g - g0) * T::kSrcGroupStride);
            const std::uint32_t chunk_dst = T::dst_offset(l.dst_row, 0) + T::dst_chunk_add(c);
            dst[lane] = static_cast<int>((chunk_dst ^ T::dst_group_xor(g)) + T::dst_group_add(g));
          }
          move_group(v, vt, keys, kBN, g, src, dst, conflicts);
        }
      }
    } else {
      // Warp w takes chunks w, w + kWarps, ..., each over every key group.
      for (int c = warp; c < Case::Traits::kHeadDimV / 32; c += T::kWarps) {
        for (int g = 0; g < kBN / 16; ++g) {
          for (int lane = 0; lane < 32; ++lane) {
            const VtChunkLane l = vt_chunk_lane(lane);
            src[lane] = T::src_offset(l.src_key, 32 * c + l.src_col) + g * T::kSrcGroupStride;
            dst[lane] =
                static_cast<int>((T::dst_offset(32 * c + l.dst_row, 0) ^ T::dst_group_xor(g)) + T::dst_group_add(g));
          }
          move_group(v, vt, keys, kBN, g, src, dst, conflicts);
        }
      }
    }
  }
  return vt;
}

// V_colmajor: the stage lands as Vᵀ with keys in order; each unit is permuted in place.
template <class Case>
std::vector<std::uint8_t> permute_stage(const std::vector<std::uint8_t>& in, int keys) {
  using T = typename Case::T;
  std::vector<std::uint8_t> out(T::kStageBytes, 0xa5);
  for (int row = 0; row < Case::Traits::kHeadDimV; ++row) {
    for (int g = 0; g < Case::Traits::kBlockN / 16; ++g) {
      const int off = T::dst_offset(row, 16 * g);
      std::uint32_t w[4], o[4];
      for (int i = 0; i < 4; ++i) {
        w[i] = in[off + 4 * i] | in[off + 4 * i + 1] << 8 | in[off + 4 * i + 2] << 16 |
               static_cast<std::uint32_t>(in[off + 4 * i + 3]) << 24;
      }
      o[0] = byte_perm(w[0], w[2], kVtLowPairs);
      o[1] = byte_perm(w[0], w[2], kVtHighPairs);
      o[2] = byte_perm(w[1], w[3], kVtLowPairs);
      o[3] = byte_perm(w[1], w[3], kVtHighPairs);
      for (int i = 0; i < 4; ++i) {
        if (keys < Case::Traits::kBlockN) o[i] &= vt_word_key_mask(i, keys - 16 * g);
        for (int b = 0; b < 4; ++b) out[off + 4 * i + b] = static_cast<std::uint8_t>(o[i] >> (8 * b));
      }
    }
  }
  return out;
}

template <class Case>
void expect_stages_become_vt() {
  using T = typename Case::T;
  constexpr int kDV = Case::Traits::kHeadDimV, kBN = Case::Traits::kBlockN;
  SCOPED_TRACE(Case::name());
  std::mt19937 rng(kDV * 1000 + kBN);
  std::vector<std::uint8_t> value(kBN * kDV);  // value[key * kDV + col]
  for (auto& b : value) b = static_cast<std::uint8_t>(rng() % 255 + 1);  // never 0: a cleared byte shows
  std::vector<std::uint8_t> rows(T::kStageBytes), cols(T::kStageBytes);
  for (int key = 0; key < kBN; ++key) {
    for (int col = 0; col < kDV; ++col) {
      rows[T::src_offset(key, col)] = value[key * kDV + col];
      cols[T::dst_offset(col, key)] = value[key * kDV + col];
    }
  }
  for (int keys : {kBN, kBN - 1, 37, 1, 0}) {
    SCOPED_TRACE("keys " + std::to_string(keys));
    int conflicts = 0;
    const std::vector<std::uint8_t> by_chunks = transpose_stage<Case>(rows, keys, false, &conflicts);
    const std::vector<std::uint8_t> by_pieces = transpose_stage<Case>(rows, keys, true, &conflicts);
    const std::vector<std::uint8_t> permuted = permute_stage<Case>(cols, keys);
    EXPECT_EQ(conflicts, 0) << "ldmatrix / stmatrix matrices that take more than one pass of the banks";
    for (int col = 0; col < kDV; ++col) {
      for (int k = 0; k < kBN; ++k) {
        const int key = k / 16 * 16 + fp8_vt_key(k % 16);
        const std::uint8_t want = key < keys ? value[key * kDV + col] : 0;
        ASSERT_EQ(by_chunks[T::dst_offset(col, k)], want) << "row " << col << " column " << k << " (key " << key << ")";
        ASSERT_EQ(by_pieces[T::dst_offset(col, k)], want) << "pieces: row " << col << " column " << k;
        ASSERT_EQ(permuted[T::dst_offset(col, k)], want) << "V_colmajor: row " << col << " column " << k;
      }
    }
  }
}

TEST(FwdVtTranspose, AddressesFollowTheLayouts) {
  for_every_case([]<class Case>() { expect_addresses_follow_the_layouts<Case>(); });
}

TEST(FwdVtTranspose, StagesBecomeVtInItsKeyOrder) {
  for_every_case([]<class Case>() { expect_stages_become_vt<Case>(); });
}

// Pieces are dealt (with FA3_FP8_VT_PIECES) exactly where they shorten the longest warp's
// share of a stage, counted in key groups; elsewhere whole chunks split evenly.
template <class Case>
void expect_pieces_only_where_they_balance() {
  using T = typename Case::T;
  SCOPED_TRACE(Case::name());
  constexpr int kChunks = Case::Traits::kHeadDimV / 32;
  const int chunk_share = (kChunks + T::kWarps - 1) / T::kWarps * T::kKeyGroups;
  const int piece_share = T::kPiecesPerWarp * T::kBatch;
  EXPECT_EQ(T::kDealPieces, kFp8VtPieces && piece_share < chunk_share);
  if (!T::kDealPieces) {
    EXPECT_TRUE(!kFp8VtPieces || kChunks % T::kWarps == 0);
  }
}

TEST(FwdVtTranspose, PiecesOnlyWhereTheyBalanceTheWarps) {
  for_every_case([]<class Case>() { expect_pieces_only_where_they_balance<Case>(); });
}

// With the transpose in shared memory every FP8 tile still fits: V's landing ring next to
// Vᵀ's costs Q's second buffer or O's own where needed, never the limit.
TEST(FwdVtTranspose, TilesFitWithTheLandingRing) {
  for (const auto& [d, tile] : std::vector<std::pair<int, FwdTile>>{{64, {128, 128}},
                                                                     {96, {128, 128}},
                                                                     {128, {128, 128}},
                                                                     {128, {128, 192}},
                                                                     {128, {128, 224}},
                                                                     {192, {128, 128}},
                                                                     {192, {128, 160}},
                                                                     {256, {128, 64}},
                                                                     {256, {128, 128}}}) {
    SCOPED_TRACE("hdim " + std::to_string(d) + ", 128x" + std::to_string(tile.block_n));
    const FwdConfig c = fwd_config(d, d, tile, 1, true);
    EXPECT_TRUE(c.vt_smem);
    EXPECT_LE(fwd_smem_bytes(d, d, tile, c.stages, c.q_stages, c.o_store == OStore::kOwnBuffer, 1, true),
              kSmemLimitBytes);
  }
  // Paired tiles keep Vᵀ from the workspace; 16-bit kernels never transpose.
  EXPECT_FALSE(fwd_config(128, 128, FwdTile{128, 128, OStore::kAuto, 0, 0, 2}, 1, true).vt_smem);
  EXPECT_FALSE(fwd_config(128, 128, FwdTile{128, 128}, 2, true).vt_smem);
  // hdim 128, 128x128 in e4m3: Q 16 KB per buffer, K, V and Vᵀ 16 KB per stage each, O 32 KB.
  EXPECT_EQ(fwd_smem_bytes(128, 128, {128, 128}, 2, 2, true, 1, true), 160 * 1024 + kSmemReserveBytes);
}

}  // namespace
}  // namespace fa3::hopper
