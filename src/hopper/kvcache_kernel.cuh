// fa3 — the KV-cache attention kernel: the query rows of one KV head (packed GQA) against
// one split of one sequence's cached keys, for decode steps and short prefills.
//
// The work is bound by memory: a decode step reads every cached K/V row once and does
// 2 · group flops per value read. So each key row is read once for all the query heads
// that share it (the CTA holds all of them), through a ring of kStages shared-memory
// stages; the tensor cores take the products through mma.sync m16n8k16 (fp32
// accumulators), and the softmax is online in fp32 with exp2. Each K or V row arrives
// by one bulk copy (cp.async.bulk, the TMA's one-dimensional form) whose bytes an
// mbarrier per stage counts: one request per row where 16-byte cp.async pieces took
// head_dim / 8, so that far fewer requests keep a stage's bytes in flight. A key row's
// address is resolved row by row (through its page for a paged cache, any page size),
// so pages need not hold whole blocks; a row's page is looked up one block ahead of its
// copy, so that the lookup's latency does not delay the copy.
//
// Masks align to the bottom-right corner of each sequence's (seqlen_q, seqlen_k); the
// keys are numbered from the sequence's first valid cache entry (cache_leftpad). Rows
// are checked element by element against their first and last key: a decode tile has
// a few blocks, and the compare is cheap beside the loads. A split writes its rows'
// normalized fp32 result and lse to the workspace for the merge kernel; a call of one
// split writes out and lse directly, and so do the splits of a tile launched as one
// cluster (KvCacheParams::cluster_merge), which merge their rows through distributed
// shared memory first. The sink joins split 0's rows only, so that the merged sum holds
// it once.
//
// An e4m3 cache (kFp8) halves the bytes a decode step reads. Its rows arrive by the
// same bulk copies into stages of codes; once a block has landed, the warps convert it
// to fp16 (exact: every e4m3 value is an fp16 one) into one staging tile laid out as a
// 16-bit stage, and the GEMMs run on that as they do on a 16-bit cache, fp16 with fp32
// accumulators, P in fp16. Q is converted once per tile. The descales, one per (batch,
// KV head) and so per CTA, fold into the softmax scale (q's and k's) and the final
// normalization (v's).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "hopper/arch/mma_sync.cuh"
#include "hopper/arch/ptx.cuh"
#include "hopper/kvcache_config.h"
#include "hopper/kvcache_keys.h"
#include "hopper/kvcache_params.h"
#include "hopper/softcap.cuh"

namespace fa3::hopper {
namespace kvcache_detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Element offset of (row, 8-element chunk) in a shared tile of kDim-wide rows: chunks
// XOR-swizzled by the row's low 3 bits, so that ldmatrix's 8 rows of one chunk column
// and cp.async's row-wise stores both spread over all banks.
template <int kDim>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kDim + ((chunk ^ (row & 7)) << 3);
}

// Element offset of (row, 8-element chunk) in a stage's K or V rows, kPitch apart
// (hopper/kvcache_config.h: padded rather than swizzled, as whole rows arrive by one copy).
template <int kPitch>
__device__ __forceinline__ int padded(int row, int chunk) {
  return row * kPitch + (chunk << 3);
}

// Zeros columns [dim, kDim) of the kBlockN rows of one tensor in every stage (rows kPitch
// apart, stages kStageElems apart): the copies write only a row's first dim columns.
template <class Element, int kDim, int kPitch, int kBlockN, int kStages>
__device__ __forceinline__ void zero_columns(Element* first_row, int dim, int stage_elems, int threads) {
  if (dim >= kDim) return;
  const int width = kDim - dim;
  for (int i = threadIdx.x; i < kStages * kBlockN * width; i += threads) {
    const int stage = i / (kBlockN * width);
    const int r = i / width % kBlockN;
    first_row[stage * stage_elems + r * kPitch + dim + i % width] = Element(0.f);
  }
}

// Where cache position `pos` of sequence b lies: its page (or, in a contiguous cache,
// the sequence's cache row) and the row within it.
struct CacheRow {
  std::int64_t outer;
  int inner;
};

__device__ __forceinline__ CacheRow cache_row_of(const CacheIndex& ix, int b, int cache_row, int pos) {
  if (ix.page_table != nullptr) {
    return {ix.page_table[b * ix.page_table_stride + pos / ix.page_size], pos % ix.page_size};
  }
  return {cache_row, pos};
}

// The first element of that row of KV head hkv in cache `t` (T: the element type, const
// to read).
template <class T>
__device__ __forceinline__ T* row_address(const CacheTensor& t, CacheRow r, int hkv) {
  return static_cast<T*>(t.data) + r.outer * t.stride[0] + static_cast<std::int64_t>(r.inner) * t.stride[1] +
         static_cast<std::int64_t>(hkv) * t.stride[2];
}

// Four e4m3 codes (little-endian in `codes`) as two fp16x2 registers, exactly.
__device__ __forceinline__ uint2 e4m3x4_to_half(std::uint32_t codes) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes >> 16), __NV_E4M3);
  return make_uint2(lo.x | (static_cast<std::uint32_t>(lo.y) << 16), hi.x | (static_cast<std::uint32_t>(hi.y) << 16));
}

// The e4m3 K and V rows of one stage (kRawKPitch / kRawVPitch bytes apart) as fp16 in
// the staging tile (kKPitch / kVPitch elements apart), 16 codes at a time: the first
// head_dim / head_dim_v columns, the rest of the staging tile staying zero.
template <class Tile>
__device__ __forceinline__ void convert_stage(const std::uint8_t* raw, __half* staging, int head_dim, int head_dim_v) {
  const int k_units = head_dim / 16, v_units = head_dim_v / 16;
  const int units = Tile::kBlockN * (k_units + v_units);
  for (int i = threadIdx.x; i < units; i += Tile::kThreads) {
    const bool is_v = i >= Tile::kBlockN * k_units;
    const int j = is_v ? i - Tile::kBlockN * k_units : i;
    const int per_row = is_v ? v_units : k_units;
    const int row = j / per_row, u = j % per_row;
    const std::uint8_t* src =
        raw + (is_v ? Tile::kBlockN * Tile::kRawKPitch + row * Tile::kRawVPitch : row * Tile::kRawKPitch) + u * 16;
    __half* dst = staging + (is_v ? Tile::kBlockN * Tile::kKPitch + padded<Tile::kVPitch>(row, 2 * u)
                                  : padded<Tile::kKPitch>(row, 2 * u));
    const uint4 codes = *reinterpret_cast<const uint4*>(src);
    const uint2 a = e4m3x4_to_half(codes.x), b = e4m3x4_to_half(codes.y);
    const uint2 c = e4m3x4_to_half(codes.z), d = e4m3x4_to_half(codes.w);
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(a.x, a.y, b.x, b.y);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(c.x, c.y, d.x, d.y);
  }
}

// The splits of one tile, one cluster (KvCacheParams::cluster_merge), merge their rows
// through distributed shared memory once each CTA holds its own: the rows unnormalized
// in s_out at the row's max over the split, that max in s_m (log2 units; -inf: no key
// and no sink) and the sum at it in s_l. CTA `rank` (its split) writes every
// num_splits-th 8-column chunk of the tile's rows, rank 0 the lse; the splits are
// summed in their order, so the same inputs give the same bits. The cluster's first
// barrier publishes each CTA's rows (release and acquire), the second keeps every CTA's
// shared memory until the others have read it.
template <class Tile, int kHeadDimV, class ElementOut>
__device__ void merge_in_cluster(const KvCacheParams& p, int b, int hkv, int row0, int rows_here, float* s_out,
                                 float* s_m, float* s_l, float v_descale) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int n = p.num_splits;
  const int rank = static_cast<int>(cluster.block_rank());
  cluster.sync();
  // Row r's max over the splits and its total sum at it.
  auto row_stats = [&](int r, float* total) {
    float m = -INFINITY;
    for (int s = 0; s < n; ++s) m = fmaxf(m, cluster.map_shared_rank(s_m, s)[r]);
    float sum = 0.f;
    for (int s = 0; s < n; ++s) {
      const float ms = cluster.map_shared_rank(s_m, s)[r];
      if (ms != -INFINITY) sum += cluster.map_shared_rank(s_l, s)[r] * exp2f(ms - m);
    }
    *total = sum;
    return m;
  };
  constexpr int kChunks = kHeadDimV / 8;
  for (int c = rank * Tile::kThreads + static_cast<int>(threadIdx.x); c < rows_here * kChunks;
       c += n * Tile::kThreads) {
    const int r = c / kChunks;
    const int ch = c % kChunks;
    if (ch * 8 >= p.head_dim_v) continue;
    float total = 0.f;
    const float m = row_stats(r, &total);
    float o[8] = {};
    for (int s = 0; s < n; ++s) {
      const float ms = cluster.map_shared_rank(s_m, s)[r];
      if (ms == -INFINITY) continue;
      const float w = exp2f(ms - m);
      const float* row = cluster.map_shared_rank(s_out, s) + r * Tile::kOutPitch + ch * 8;
      const float4 lo = reinterpret_cast<const float4*>(row)[0], hi = reinterpret_cast<const float4*>(row)[1];
      const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] += w * v[e];
    }
    const float inv = total > 0.f ? v_descale / total : 0.f;
    const int row = row0 + r;
    const int h = hkv * p.group + row % p.group;
    ElementOut* out = static_cast<ElementOut*>(p.out.data) + b * p.out.stride[0] +
                      static_cast<std::int64_t>(row / p.group) * p.out.stride[1] + h * p.out.stride[2] + ch * 8;
    *reinterpret_cast<uint4*>(out) =
        make_uint4(arch::pack2<ElementOut>(o[0] * inv, o[1] * inv), arch::pack2<ElementOut>(o[2] * inv, o[3] * inv),
                   arch::pack2<ElementOut>(o[4] * inv, o[5] * inv), arch::pack2<ElementOut>(o[6] * inv, o[7] * inv));
  }
  if (rank == 0 && p.lse != nullptr) {
    for (int r = static_cast<int>(threadIdx.x); r < rows_here; r += Tile::kThreads) {
      float total = 0.f;
      const float m = row_stats(r, &total);
      const int row = row0 + r;
      const int h = hkv * p.group + row % p.group;
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + (row / p.group) * p.lse_stride[2]] =
          total > 0.f ? m * kLn2 + logf(total) : -INFINITY;
    }
  }
  // Every read of another CTA's shared memory has completed (its value is stored): no
  // ordering to publish, so the arrival is relaxed and skips the first one's fence.
  cute::cluster_arrive_relaxed();
  cute::cluster_wait();
}

// Descale (b, hkv) of an e4m3 call (1 when not given).
__device__ __forceinline__ float descale_of(const KvCacheParams::Descale& d, int b, int hkv) {
  return d.ptr == nullptr ? 1.f : d.ptr[b * d.stride[0] + hkv * d.stride[1]];
}

}  // namespace kvcache_detail

// Element: the GEMMs' type (fp16 for an e4m3 cache, kFp8); ElementOut: out's.
template <class Element, int kHeadDim, int kHeadDimV, int kBlockM, bool kFp8 = false, class ElementOut = Element>
__global__ void __launch_bounds__(KvCacheTile<kHeadDim, kHeadDimV, kBlockM, kFp8>::kThreads, 1)
    kvcache_kernel(const __grid_constant__ KvCacheParams p) {
  using namespace kvcache_detail;
  using Tile = KvCacheTile<kHeadDim, kHeadDimV, kBlockM, kFp8>;
  using Input = std::conditional_t<kFp8, std::uint8_t, Element>;  // what q and the caches hold
  static_assert(!kFp8 || std::is_same_v<Element, __half>, "e4m3 converts to fp16 exactly, not to bf16");
  constexpr int kBlockN = Tile::kBlockN;
  constexpr int kWarpN = Tile::kWarpN;
  constexpr int kKeyWarps = Tile::kKeyWarps;
  constexpr int kStageElems = kBlockN * (Tile::kKPitch + Tile::kVPitch);
  // A split call's merge (launched as a programmatic dependent) may start its launch
  // now: it waits for this grid's completion before reading the partials, and its launch
  // latency, a visible share of a small decode step, passes while this grid runs.
  arch::launch_dependent_grids();

  extern __shared__ __align__(128) unsigned char smem[];
  Element* s_q = reinterpret_cast<Element*>(smem);
  // The ring of 16-bit stages, or with kFp8 the staging tile, the ring of codes after it.
  Element* s_kv = reinterpret_cast<Element*>(smem + Tile::kQBytes);
  std::uint8_t* s_raw = smem + Tile::kQBytes + Tile::kStagingBytes;
  float* s_out = reinterpret_cast<float*>(smem + Tile::kQBytes);  // after the last key block
  float* s_max = reinterpret_cast<float*>(smem + Tile::kQBytes + Tile::kKvBytes);
  float* s_sum = s_max + kKeyWarps * kBlockM;
  float* s_inv = s_sum + kKeyWarps * kBlockM;

  const int b = blockIdx.x / p.nheads_kv;
  const int hkv = blockIdx.x % p.nheads_kv;
  const int row0 = blockIdx.y * kBlockM;
  const int split = blockIdx.z;
  const int rows = p.seqlen_q * p.group;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row_warp = warp % Tile::kRowWarps;
  const int key_warp = warp / Tile::kRowWarps;

  const CacheIndex& ix = p.index;
  const int leftpad = ix.leftpad != nullptr ? ix.leftpad[b] : 0;
  const int seqlen_k = ix.seqlens[b] + ix.seqlen_new - leftpad;
  const int cache_row = ix.batch_idx != nullptr ? ix.batch_idx[b] : b;
  const SequenceMask mask{p.seqlen_q, seqlen_k, p.window_left, p.window_right, p.chunk};

  // The tile's keys: from its first row's first key to its last row's last (both bounds
  // never decrease along the rows), in blocks, divided evenly among the splits.
  const int last_row = min(row0 + kBlockM, rows) - 1;
  const int key_begin = mask.first_key(row0 / p.group);
  const int key_end = mask.last_key(last_row / p.group) + 1;
  int n_first = 0;
  const int count = split_blocks(key_begin, key_end, kBlockN, p.num_splits, split, &n_first);

  // The stages' barriers, and zeros in their columns past the head dims, which the
  // copies leave alone and the GEMMs read (they run over the padded head dims whole).
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem + Tile::kBarrierOffset);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < Tile::kStages; ++s) cutlass::arch::ClusterTransactionBarrier::init(&full[s], 1);
    cutlass::arch::fence_barrier_init();
  }
  constexpr int kZeroedStages = kFp8 ? 1 : Tile::kStages;  // the staging tile alone with kFp8
  zero_columns<Element, kHeadDim, Tile::kKPitch, kBlockN, kZeroedStages>(s_kv, p.head_dim, kStageElems,
                                                                         Tile::kThreads);
  zero_columns<Element, kHeadDimV, Tile::kVPitch, kBlockN, kZeroedStages>(s_kv + kBlockN * Tile::kKPitch,
                                                                          p.head_dim_v, kStageElems, Tile::kThreads);

  // Q's rows of the tile, zero past the rows and past the head dim (e4m3 codes converted).
  {
    constexpr int kChunks = kHeadDim / 8;
    const Input* q = static_cast<const Input*>(p.q.data);
#pragma unroll
    for (int c = threadIdx.x; c < kBlockM * kChunks; c += Tile::kThreads) {
      const int r = c / kChunks;
      const int ch = c % kChunks;
      const int row = row0 + r;
      const bool valid = row < rows && ch * 8 < p.head_dim;
      const Input* src = q;
      if (valid) {
        const int h = hkv * p.group + row % p.group;
        src = q + b * p.q.stride[0] + static_cast<std::int64_t>(row / p.group) * p.q.stride[1] + h * p.q.stride[2] +
              ch * 8;
      }
      if constexpr (kFp8) {
        const uint2 codes = valid ? *reinterpret_cast<const uint2*>(src) : make_uint2(0u, 0u);
        const uint2 lo = e4m3x4_to_half(codes.x), hi = e4m3x4_to_half(codes.y);
        *reinterpret_cast<uint4*>(s_q + swizzle<kHeadDim>(r, ch)) = make_uint4(lo.x, lo.y, hi.x, hi.y);
      } else {
        arch::cp_async_16(s_q + swizzle<kHeadDim>(r, ch), src, valid);
      }
    }
    arch::cp_async_commit();
  }

  // The copies: thread t brings row t / 2 of each block, of K (t even) or V (t odd).
  // Keys past the sequence copy its last key's row instead: finite values, whose scores
  // are masked out (P = 0), where memory past the end might hold a NaN that P·V would
  // turn 0 · NaN into.
  static_assert(Tile::kThreads == 2 * kBlockN, "one row copy per thread and block");
  const int copy_row = threadIdx.x / 2;
  const bool copy_v = threadIdx.x % 2 != 0;
  const CacheTensor& copy_cache = copy_v ? p.v : p.k;
  const auto copy_bytes = static_cast<std::uint32_t>((copy_v ? p.head_dim_v : p.head_dim) * sizeof(Input));
  const auto stage_bytes = static_cast<std::uint32_t>(kBlockN * (p.head_dim + p.head_dim_v) * sizeof(Input));
  const int copy_offset = copy_v ? kBlockN * Tile::kKPitch + copy_row * Tile::kVPitch : copy_row * Tile::kKPitch;
  const int raw_offset =
      copy_v ? kBlockN * Tile::kRawKPitch + copy_row * Tile::kRawVPitch : copy_row * Tile::kRawKPitch;
  auto source_of = [&](int it) {
    const int key = min((n_first + it) * kBlockN + copy_row, seqlen_k - 1);
    return cache_row_of(ix, b, cache_row, leftpad + key);
  };
  // Thread 0 arrives on a block's barrier announcing the block's bytes; every thread
  // issues its row's copy. The order between the two does not matter: a copy that lands
  // first takes the barrier's byte count below zero for a while, and the phase completes
  // only once the arrival and all the bytes are in.
  auto expect_block = [&](int it) {
    if (threadIdx.x == 0) {
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[it % Tile::kStages], stage_bytes);
    }
  };
  auto issue_block = [&](int it, CacheRow src) {
    const int stage = it % Tile::kStages;
    if constexpr (kFp8) {
      arch::bulk_load(s_raw + stage * Tile::kRawStageBytes + raw_offset, row_address<const Input>(copy_cache, src, hkv),
                      copy_bytes, &full[stage]);
    } else {
      arch::bulk_load(s_kv + stage * kStageElems + copy_offset, row_address<const Input>(copy_cache, src, hkv),
                      copy_bytes, &full[stage]);
    }
  };
  __syncthreads();  // the barriers initialized, the zeros written
#pragma unroll
  for (int s = 0; s < Tile::kStages - 1; ++s) {
    if (s < count) {
      expect_block(s);
      issue_block(s, source_of(s));
    }
  }
  // The page of this thread's row in the next block to issue, looked up a block ahead.
  CacheRow next_source{};
  if (Tile::kStages - 1 < count) next_source = source_of(Tile::kStages - 1);
  arch::cp_async_wait<0>();  // this thread's pieces of Q: the loop's first barrier publishes them

  // Each thread holds rows g and g + 8 of its warp's 16 (g = lane / 4): their keys.
  int first_key[2], last_key[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int row = row0 + row_warp * 16 + lane / 4 + 8 * x;
    first_key[x] = row < rows ? mask.first_key(row / p.group) : 0;
    last_key[x] = row < rows ? mask.last_key(row / p.group) : -1;
  }
  // Blocks whose every key every row of the tile sees need no mask: the rows' first keys
  // and last keys never decrease along the rows, so the tile's latest first key and
  // earliest last key bound them all.
  const int tile_first_key = mask.first_key(last_row / p.group);
  const int tile_last_key = mask.last_key(row0 / p.group);
  // q's and k's descales scale every score of the CTA alike, v's every value.
  float qk_descale = 1.f, v_descale = 1.f;
  if constexpr (kFp8) {
    qk_descale = descale_of(p.q_descale, b, hkv) * descale_of(p.k_descale, b, hkv);
    v_descale = descale_of(p.v_descale, b, hkv);
  }
  const float score_scale = p.softmax_scale * qk_descale;
  const Softcap softcap(p.softcap, score_scale);
  const float scale_log2 = (softcap.on ? softcap.cap : score_scale) * kLog2e;

  float acc[kHeadDimV / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  for (int it = 0; it < count; ++it) {
    arch::mbarrier_wait(&full[it % Tile::kStages], (it / Tile::kStages) & 1);
    const int refill = it + Tile::kStages - 1;
    if (refill < count) expect_block(refill);
    // Past this barrier every warp has finished the previous iteration, so the stage it
    // read may be refilled.
    __syncthreads();
    if (refill < count) {
      issue_block(refill, next_source);
      if (refill + 1 < count) next_source = source_of(refill + 1);
    }

    if constexpr (kFp8) {
      // The block's codes into the staging tile, which every warp has finished reading
      // (the barrier above), then visible to all of them.
      convert_stage<Tile>(s_raw + (it % Tile::kStages) * Tile::kRawStageBytes, s_kv, p.head_dim, p.head_dim_v);
      __syncthreads();
    }
    const Element* s_k = kFp8 ? s_kv : s_kv + (it % Tile::kStages) * kStageElems;
    const Element* s_v = s_k + kBlockN * Tile::kKPitch;
    const int key0 = key_warp * kWarpN;  // the warp's keys within the block

    // S = Q·Kᵀ over the whole padded head dim (columns past the call's are zeros in Q
    // and K), the k-steps alternating between two accumulators so that the MMAs form
    // two dependent chains of half the length, summed at the end: with a few warps per
    // SM, one chain's latency would set the block's time.
    float s[kWarpN / 8][4] = {}, s_odd[kWarpN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      std::uint32_t a[4];
      arch::ldmatrix_x4(a, s_q + swizzle<kHeadDim>(row_warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
      float(&acc_s)[kWarpN / 8][4] = kk % 2 == 0 ? s : s_odd;
#pragma unroll
      for (int np = 0; np < kWarpN / 16; ++np) {
        std::uint32_t bk[4];
        arch::ldmatrix_x4(bk, s_k + padded<Tile::kKPitch>(key0 + np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                          kk * 2 + ((lane >> 3) & 1)));
        arch::mma_16816<Element>(acc_s[2 * np], a, bk[0], bk[1]);
        arch::mma_16816<Element>(acc_s[2 * np + 1], a, bk[2], bk[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kWarpN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] += s_odd[nt][e];
    }

    if (softcap.on) {
#pragma unroll
      for (int nt = 0; nt < kWarpN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = tanh_scaled(s[nt][e], softcap.ex2_in);
      }
    }
    const int block_first = (n_first + it) * kBlockN;
    if (block_first < tile_first_key || block_first + kBlockN - 1 > tile_last_key) {
      const int block_key = block_first + key0 + 2 * (lane & 3);
#pragma unroll
      for (int nt = 0; nt < kWarpN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = e / 2;
          const int key = block_key + nt * 8 + (e & 1);
          if (key < first_key[x] || key > last_key[x]) s[nt][e] = -INFINITY;
        }
      }
    }

    // Online softmax, per row over the 4 lanes that share it. Once a row's max has
    // settled, most blocks leave it unchanged and the rescale would multiply by exactly
    // 1: the warp skips it when none of its rows' maxima moved.
    float max_new[2];
    bool moved = false;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kWarpN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * x], s[nt][2 * x + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      max_new[x] = fmaxf(row_max[x], mx * scale_log2);
      moved |= max_new[x] != row_max[x];
    }
    // A row that has seen no key yet keeps a max of -inf: exp2 against 0 then gives 0.
    const float max_used[2] = {max_new[0] == -INFINITY ? 0.f : max_new[0],
                               max_new[1] == -INFINITY ? 0.f : max_new[1]};
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const float rescale = arch::exp2_approx(row_max[x] - max_used[x]);
        row_sum[x] *= rescale;
#pragma unroll
        for (int dt = 0; dt < kHeadDimV / 8; ++dt) {
          acc[dt][2 * x] *= rescale;
          acc[dt][2 * x + 1] *= rescale;
        }
      }
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      row_max[x] = max_new[x];
#pragma unroll
      for (int nt = 0; nt < kWarpN / 8; ++nt) {
#pragma unroll
        for (int e = 2 * x; e < 2 * x + 2; ++e) {
          s[nt][e] = arch::exp2_approx(fmaf(s[nt][e], scale_log2, -max_used[x]));
          row_sum[x] += s[nt][e];
        }
      }
    }

    // O += P · V: P's accumulator fragments are the A operand's layout, 16 keys a step.
#pragma unroll
    for (int ks = 0; ks < kWarpN / 16; ++ks) {
      const std::uint32_t a[4] = {
          arch::pack2<Element>(s[2 * ks][0], s[2 * ks][1]), arch::pack2<Element>(s[2 * ks][2], s[2 * ks][3]),
          arch::pack2<Element>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
          arch::pack2<Element>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kHeadDimV / 16; ++dp) {
        std::uint32_t bv[4];
        arch::ldmatrix_x4_trans(bv,
                                s_v + padded<Tile::kVPitch>(key0 + ks * 16 + (lane & 15), dp * 2 + (lane >> 4)));
        arch::mma_16816<Element>(acc[2 * dp], a, bv[0], bv[1]);
        arch::mma_16816<Element>(acc[2 * dp + 1], a, bv[2], bv[3]);
      }
    }
  }
  // Every copy issued has landed (the loop waited for each block it issued) and every
  // stage has been read: the result may take their place.
  __syncthreads();

  // Each warp's rows: max and sum over its keys, then the row's over all warps and the
  // sink (split 0 only, in log2 units like the scores).
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    row_sum[x] += __shfl_xor_sync(0xffffffffu, row_sum[x], 1);
    row_sum[x] += __shfl_xor_sync(0xffffffffu, row_sum[x], 2);
    if ((lane & 3) == 0) {
      const int r = row_warp * 16 + lane / 4 + 8 * x;
      s_max[key_warp * kBlockM + r] = row_max[x];
      s_sum[key_warp * kBlockM + r] = row_sum[x];
    }
  }
  __syncthreads();
  const bool with_sink = p.sinks != nullptr && split == 0;
  auto sink_of = [&](int r) {
    const int h = hkv * p.group + (row0 + r) % p.group;
    return p.sinks[h * p.sinks_stride] * kLog2e;
  };
  auto total_max = [&](int r) {
    float m = with_sink ? sink_of(r) : -INFINITY;
#pragma unroll
    for (int w = 0; w < kKeyWarps; ++w) m = fmaxf(m, s_max[w * kBlockM + r]);
    return m;
  };

  // The warps' accumulators into s_out, each scaled to the row's max: one warp of the key
  // split after another, in a fixed order (bitwise the same result every run).
  float scale[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int r = row_warp * 16 + lane / 4 + 8 * x;
    scale[x] = row_max[x] == -INFINITY ? 0.f : exp2f(row_max[x] - total_max(r));
  }
#pragma unroll
  for (int w = 0; w < kKeyWarps; ++w) {
    if (key_warp == w) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        float* out_row = s_out + (row_warp * 16 + lane / 4 + 8 * x) * Tile::kOutPitch + 2 * (lane & 3);
#pragma unroll
        for (int dt = 0; dt < kHeadDimV / 8; ++dt) {
          float2 v = make_float2(acc[dt][2 * x] * scale[x], acc[dt][2 * x + 1] * scale[x]);
          if (w > 0) {
            const float2 old = *reinterpret_cast<const float2*>(out_row + dt * 8);
            v.x += old.x;
            v.y += old.y;
          }
          *reinterpret_cast<float2*>(out_row + dt * 8) = v;
        }
      }
    }
    __syncthreads();
  }

  // A row's sum at its max m: the sink's term and every key warp's.
  auto total_sum = [&](int r, float m) {
    float sum = with_sink ? exp2f(sink_of(r) - m) : 0.f;
#pragma unroll
    for (int w = 0; w < kKeyWarps; ++w) {
      const float mw = s_max[w * kBlockM + r];
      if (mw != -INFINITY) sum += s_sum[w * kBlockM + r] * exp2f(mw - m);
    }
    return sum;
  };
  const int rows_here = min(kBlockM, rows - row0);
  if constexpr (kKvClusterMerge) {
    if (p.cluster_merge) {
      // This split's rows as the cluster merges them: s_out holds them at the row's max
      // over the split, which goes to s_inv (-inf where the split saw no key and no
      // sink), and the sum at it to warp 0's entries of s_sum, each read just before.
      for (int r = threadIdx.x; r < rows_here; r += Tile::kThreads) {
        const float m = total_max(r);
        const float sum = total_sum(r, m);
        s_inv[r] = sum > 0.f ? m : -INFINITY;
        s_sum[r] = sum;
      }
      merge_in_cluster<Tile, kHeadDimV, ElementOut>(p, b, hkv, row0, rows_here, s_out, s_inv, s_sum, v_descale);
      return;
    }
  }

  // Per row: 1/sum for the values, and the lse (-inf and a result of 0 where no key and
  // no sink was seen).
  for (int r = threadIdx.x; r < rows_here; r += Tile::kThreads) {
    const float m = total_max(r);
    const float sum = total_sum(r, m);
    s_inv[r] = sum > 0.f ? 1.f / sum : 0.f;
    const float lse = sum > 0.f ? m * kLn2 + logf(sum) : -INFINITY;
    const int row = row0 + r;
    const int i = row / p.group;
    const int h = hkv * p.group + row % p.group;
    if (p.num_splits == 1) {
      if (p.lse != nullptr) p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] = lse;
    } else {
      p.lse_partial[((static_cast<std::int64_t>(split) * p.batch + b) * p.seqlen_q + i) * p.nheads_q + h] = lse;
    }
  }
  __syncthreads();

  // The rows out, 16 bytes per access along each row.
  constexpr int kChunks = kHeadDimV / 8;
  for (int c = threadIdx.x; c < rows_here * kChunks; c += Tile::kThreads) {
    const int r = c / kChunks;
    const int ch = c % kChunks;
    if (ch * 8 >= p.head_dim_v) continue;
    const int row = row0 + r;
    const int i = row / p.group;
    const int h = hkv * p.group + row % p.group;
    const float inv = s_inv[r] * v_descale;
    const float4 lo = *reinterpret_cast<const float4*>(s_out + r * Tile::kOutPitch + ch * 8);
    const float4 hi = *reinterpret_cast<const float4*>(s_out + r * Tile::kOutPitch + ch * 8 + 4);
    if (p.num_splits == 1) {
      uint4 v;
      v.x = arch::pack2<ElementOut>(lo.x * inv, lo.y * inv);
      v.y = arch::pack2<ElementOut>(lo.z * inv, lo.w * inv);
      v.z = arch::pack2<ElementOut>(hi.x * inv, hi.y * inv);
      v.w = arch::pack2<ElementOut>(hi.z * inv, hi.w * inv);
      ElementOut* out = static_cast<ElementOut*>(p.out.data) + b * p.out.stride[0] +
                        static_cast<std::int64_t>(i) * p.out.stride[1] + h * p.out.stride[2] + ch * 8;
      *reinterpret_cast<uint4*>(out) = v;
    } else {
      float* out = p.out_partial +
                   (((static_cast<std::int64_t>(split) * p.batch + b) * p.seqlen_q + i) * p.nheads_q + h) *
                       p.head_dim_v +
                   ch * 8;
      reinterpret_cast<float4*>(out)[0] = make_float4(lo.x * inv, lo.y * inv, lo.z * inv, lo.w * inv);
      reinterpret_cast<float4*>(out)[1] = make_float4(hi.x * inv, hi.y * inv, hi.z * inv, hi.w * inv);
    }
  }
}

}  // namespace fa3::hopper
