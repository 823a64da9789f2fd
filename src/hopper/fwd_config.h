// fa3 — forward kernel configurations: tile shapes, pipeline depth, warpgroup roles
// and register budgets. A configuration follows from (head dim, tile) by the rules
// below; which tiles are compiled is the build's choice (src/CMakeLists.txt) and
// which one runs is the dispatcher's (fwd_dispatch.cpp).
//
// Shared memory per CTA, with d the Q/K head dim, dv V's and e the inputs' bytes per
// element (2 for bf16/fp16, 1 for e4m3): Q q_stages*block_m*d*e, K stages*block_n*d*e,
// V stages*block_n*dv*e, and O block_m*dv*2 (O is 16-bit whatever the inputs) when it
// has a buffer of its own. The Hopper limit is 227 KB.
#pragma once

#include <initializer_list>

namespace fa3::hopper {

// How the epilogue gets O to global memory.
enum class OStore {
  kAuto,       // kOwnBuffer when it fits in shared memory, else kRegisters
  kOwnBuffer,  // stmatrix into a buffer of O's own, then a TMA store
  kQBuffer,    // the same through Q's buffer: the next Q waits for the store
  kRegisters,  // 16-byte global stores straight from registers (no shared memory)
};

// The CTA tile: query rows (64 per consumer warpgroup) by keys per K/V block, the
// epilogue's path for O, the K/V ring depth and the number of Q buffers (0: chosen by
// fwd_config), and the CTAs per cluster that share each K/V load (0 or 1: none;
// non-causal only).
struct FwdTile {
  int block_m;
  int block_n;
  OStore o_store = OStore::kAuto;
  int stages = 0;
  int q_stages = 0;
  int cluster = 0;
};

struct FwdConfig {
  int block_m;          // query rows per CTA tile (64 per consumer warpgroup)
  int block_n;          // keys per K/V block
  int stages;           // K/V shared-memory ring depth
  int q_stages;         // Q buffers: 2 loads the next tile's Q while this one runs
  int consumer_wgs;     // consumer warpgroups (block_m / 64)
  int producer_regs;    // setmaxnreg for the producer warpgroup
  int consumer_regs;    // setmaxnreg for each consumer warpgroup
  bool pingpong;        // order consumer warpgroups' GEMMs with named barriers
  OStore o_store;       // never kAuto
  bool lazy_rescale;    // move a row's softmax reference only on large growth (softmax.cuh)
  bool skip_blocks;     // a warpgroup skips the key blocks its rows do not see (fwd_mainloop.cuh)
  bool q_registers;     // Q·Kᵀ reads Q from registers, loaded once per tile (fwd_mainloop.cuh)
  int cluster_m;        // CTAs of a cluster, on consecutive query blocks, sharing each K/V load
  bool vt_smem = false; // FP8: V transposed in shared memory by the producer warpgroup (kFp8VtInSmem)
  bool varlen = false;  // carries the varlen paths (fwd_carries_varlen); set by launch_fwd

  constexpr int threads() const { return 128 * (consumer_wgs + 1); }
  // Registers per thread at launch: the register file split evenly, in units of 8.
  constexpr int launch_regs() const { return 65536 / threads() / 8 * 8; }
  // setmaxnreg.inc blocks until the registers it asks for are free, so the budgets
  // must fit in what the CTA was launched with, or the consumers wait forever.
  constexpr bool registers_fit() const {
    return 128 * (producer_regs + consumer_wgs * consumer_regs) <= threads() * launch_regs();
  }
};

// Whether the kernels carry the varlen paths at all: only in a build with FA3_GPU_VARLEN.
#ifdef FA3_GPU_VARLEN
inline constexpr bool kVarlenKernels = true;
#else
inline constexpr bool kVarlenKernels = false;
#endif

// Whether varlen calls with e4m3 inputs run on the FP8 kernels: only in a build with
// FA3_GPU_FP8_VARLEN (which needs FA3_GPU_VARLEN; on by default).
#ifdef FA3_GPU_FP8_VARLEN
inline constexpr bool kFp8VarlenKernels = kVarlenKernels;
#else
inline constexpr bool kFp8VarlenKernels = false;
#endif

// Whether the forward kernels of QK head dim `head_dim` and one mask family are the ones
// that carry the varlen paths. The 16-bit ones of head dim 64 with tuned plain and
// causal kernels run at the register limit (four consumer warpgroups at 112 registers,
// three at 160): the varlen paths made them spill 52-84 bytes and cost fixed-length
// calls 5-12 % (docs/perf-log.md). There only the general kernel carries them, and
// varlen calls of head dim 64 run on it (fwd_dispatch.cpp); every other kernel carries
// them at no measured cost. The FP8 kernels have no general family: with
// kFp8VarlenKernels those of head dim 64 (two consumer warpgroups) carry them too.
constexpr bool fwd_family_carries_varlen(int head_dim, bool general_mask, bool fp8 = false) {
  return general_mask || head_dim > 64 || (fp8 && kFp8VarlenKernels);
}
// Whether such a kernel carries them in this build.
constexpr bool fwd_carries_varlen(int head_dim, bool general_mask, bool fp8 = false) {
  return kVarlenKernels && fwd_family_carries_varlen(head_dim, general_mask, fp8);
}

// The FP8 kernels' lean softmax at the head dims of FA3_FP8_LEAN_HEAD_DIMS (on where it
// has run on a GPU and measured faster):
// k's block scale enters the softmax once per block instead of multiplying every score,
// and the softmax references move lazily, as the 16-bit kernels' do, with a growth
// bound that keeps the shifted e4m3 P in range (hopper/softmax.cuh). Calls with block
// scales still rescale O at every key block, for V's scales (hopper/fp8_scales.cuh).
// Read from SASS: the hdim 128 kernel's step without a mask issued about 9.3
// instructions per score, one multiply for k's scale and one for O's rescale among them,
// where FlashAttention-3's FP8 kernel issues 6.1 (docs/perf-log.md).
// The build passes the list as FA3_FP8_LEAN_HEAD_DIM_BITS, bit d / 32 for head dim d.
constexpr bool fp8_lean_softmax([[maybe_unused]] int head_dim) {
#ifdef FA3_FP8_LEAN_HEAD_DIM_BITS
  return head_dim % 32 == 0 && head_dim <= 256 && ((FA3_FP8_LEAN_HEAD_DIM_BITS >> (head_dim / 32)) & 1) != 0;
#else
  return false;
#endif
}

// Whether the FP8 kernels transpose V themselves, tile by tile in shared memory (two
// warps of the producer warpgroup, hopper/fwd_vt_transpose.cuh), instead of reading Vᵀ
// from the caller's workspace, written by a pass over V before the kernel
// (hopper/fp8_vt.h): in a build with FA3_FP8_VT_SMEM (on by default). FP8 calls then
// need no workspace.
#ifdef FA3_FP8_VT_SMEM
inline constexpr bool kFp8VtInSmem = true;
#else
inline constexpr bool kFp8VtInSmem = false;
#endif

// Whether the transposing warps of those kernels take each stage of V in pieces (a few
// key groups of one chunk of columns) dealt in turn, instead of whole chunks each
// (hopper/fwd_vt_transpose.cuh): the build's FA3_FP8_VT_PIECES, for the tiles whose
// chunks do not split evenly between their warps. At head dim 256 three warps then
// share eight chunks as 11, 11 and 10 pieces instead of 12, 12 and 8, both
// loads of a piece are in flight at once instead of one, and each warp's pieces take
// constant offsets (about 15 instructions a piece, no local memory in the loop). On an
// H100: 1.4-4.4 % faster at head dim 256 from 2k tokens, level at 96 (docs/perf-log.md);
// an earlier form, offsets computed per piece, had halved the consumers' wait for Vᵀ but
// issued twice the transpose's instructions and gained nothing.
#ifdef FA3_FP8_VT_PIECES
inline constexpr bool kFp8VtPieces = true;
#else
inline constexpr bool kFp8VtPieces = false;
#endif

// The forward's K and V loads carry the L2's evict-last policy and its Q loads
// evict-first (the build's FA3_FWD_L2_HINTS). A head's K and V are read by every query
// block of the head, in the causal and general orders by the group's CTAs together
// (causal_heads_per_group sizes the groups for 16 MB of them), while Q is read once and O
// written once; FlashAttention-3 marks its loads so. Off: at head dims 128 and 256 on an
// H100 level within 1.5 % at every length, up to 2.3 % faster only at head dim 256 causal
// 512 and 1k (docs/perf-log.md).
#ifdef FA3_FWD_L2_HINTS
inline constexpr bool kFwdL2Hints = true;
#else
inline constexpr bool kFwdL2Hints = false;
#endif

// The consumers stamp their cycle counter at each key block's turn, scores, softmax and
// P·V, into a buffer that the launch reads back (hopper/timeline.h): the build's
// FA3_FWD_TIMELINE, off. A diagnosis build: the stamps and the launch's read-back cost time.
#ifdef FA3_FWD_TIMELINE
inline constexpr bool kFwdTimeline = true;
#else
inline constexpr bool kFwdTimeline = false;
#endif

// Whether varlen forward calls take an order of real tiles only, sequence by sequence,
// drawn from the tile counter as CTAs finish (hopper/varlen_tiles.cuh; the build's
// FA3_VARLEN_DYNAMIC_ORDER, on by default), on 16-bit kernels without CTA pairs. Otherwise
// every sequence gets the longest one's query blocks, the empty ones skipped as they
// are drawn, and the non-causal kernels' order is static. On an H100, 16k tokens in 17
// sequences of 211 to 2912 ran 7-8 % faster with this order without a mask and level to
// 3 % faster causal (1.20-1.24x and 1.12-1.26x a fixed-length call of the same work,
// against the model's 1.02-1.03x: the rest is the sequences' partial blocks, not the
// order; scripts/sim_varlen_order.py, docs/perf-log.md).
#ifdef FA3_VARLEN_DYNAMIC_ORDER
inline constexpr bool kVarlenDynamicOrder = true;
#else
inline constexpr bool kVarlenDynamicOrder = false;
#endif

// When the producer of a dynamic (causal, general-mask) order draws its CTA's next tile:
// -1 as the current tile starts, or L >= 0 once all but the last L of the current tile's
// K/V blocks are loading. A tile drawn early is held through the whole current tile, and
// at the end of a call whose tiles differ in length CTAs start long held tiles while
// others have run out of work: a model of the order (132 CTAs, a tile's time its key
// blocks) leaves 1-6 % of the SMs' time idle that way at head dims 128-256 causal, 0.2-2 %
// drawn late. The price: the next tile's first loads (with two Q stages its Q) wait for
// the draw. Measured per kernel head dim on bf16 causal calls, 512-16k keys, leads -1, 0,
// 1, 2, 4 and 8, three runs (docs/perf-log.md): lead 0 at 64 (+2-4 % at 512 and 1k) and
// 256 (+1-3 % at 512, 1k and 8k, level between); at 192 it loses 8 % at 512 keys and
// gains 2-3 % from 4k; at 128 it gains 2.6 % at 512 and loses 1 % at 2k; at 96 it loses
// 1-2.5 % from 1k to 4k. No lead of 1 to 8 hid the draw where lead 0 lost. FP8 kernels:
// not measured.
constexpr int fwd_draw_lead(int head_dim, int seqlen_k, bool fp8) {
  if (fp8) return -1;
  switch (head_dim) {
    case 64:
    case 256:
      return 0;
    case 128:
      return seqlen_k <= 512 ? 0 : -1;
    case 192:
      return seqlen_k >= 4096 ? 0 : -1;
    default:
      return -1;
  }
}

inline constexpr int kSmemLimitBytes = 227 * 1024;
// Barriers and alignment padding on top of the operand buffers.
inline constexpr int kSmemReserveBytes = 2048;

// With V transposed in shared memory (vt_smem), V's ring holds V as it lands and a second
// ring of as many stages holds Vᵀ.
constexpr int fwd_smem_bytes(int head_dim, int head_dim_v, FwdTile tile, int stages, int q_stages, bool o_buffer,
                             int input_bytes = 2, bool vt_smem = false) {
  const int q = tile.block_m * head_dim * input_bytes;
  const int kv = stages * tile.block_n * (head_dim + (vt_smem ? 2 : 1) * head_dim_v) * input_bytes;
  const int o = tile.block_m * head_dim_v * 2;
  return q_stages * q + kv + (o_buffer ? o : 0) + kSmemReserveBytes;
}
constexpr int fwd_smem_bytes(int head_dim, FwdTile tile, int stages, int q_stages, bool o_buffer) {
  return fwd_smem_bytes(head_dim, head_dim, tile, stages, q_stages, o_buffer);
}

// Register budgets, each a multiple of 8 in [24, 256] with registers_fit(): two
// consumer warpgroups launch at 168 per thread (64512 in all) = 24 + 2 * 240 or
// 56 + 2 * 224; three at 128 per thread = 32 + 3 * 160; four at 96 per thread =
// 32 + 4 * 112, which holds a 64x64 score block at head dim 64 and no wider one
// (64x96 spilled 240 bytes). O gets its own buffer whenever it fits, so that Q's can
// be refilled for the next tile while this one finishes; otherwise (hdim 192, 256) it
// leaves from registers, which frees Q's buffer after the last Q·Kᵀ: 5-9 % ahead of
// O through Q's buffer at 512 tokens and level or ahead at every other length
// (docs/perf-log.md). A second Q buffer, where it fits, has the next tile's Q in
// shared memory before this tile ends; with one, the consumers wait for it at every
// tile start. O in Q's buffer (forced, "-oq") needs Q's single buffer.
//
// With a V head dim of its own (head_dim_v), the rules that concern O (its registers,
// its rescale) follow head_dim_v and those that concern Q follow head_dim.
//
// FP8 (e4m3) inputs (input_bytes 1) take the same rules, with two exceptions: Q·Kᵀ
// reads Q from shared memory (an e4m3 A operand from registers would need Q's bytes
// regrouped after ldmatrix), and the softmax is the plain online one unless lean
// (fp8_lean_softmax), since P is shifted by 2^8 before its rounding to e4m3 and a stale
// reference must not push it past e4m3's range (hopper/softmax.cuh); its rescale of O
// also applies V's block scales (hopper/fp8_scales.cuh).
// `fp8_vt_smem`: whether FP8 kernels transpose V in shared memory (the build's choice;
// tests ask for either).
constexpr FwdConfig fwd_config(int head_dim, int head_dim_v, FwdTile tile, int input_bytes = 2,
                               bool fp8_vt_smem = kFp8VtInSmem) {
  const bool fp8 = input_bytes == 1;
  const int wgs = tile.block_m / 64;
  // Four warpgroups go through a 64-key block in about half the time three take for a
  // 128-key one, so two stages would request a tile's first block too late to hide
  // its latency: a third (8 KB per operand at hdim 64) gained 3-5 % at 512 tokens.
  const int stages = tile.stages != 0 ? tile.stages : wgs == 4 ? 3 : 2;
  // Paired tiles multicast V's stages as they land, which the transpose would have to
  // follow CTA by CTA: the FP8 kernels transpose in shared memory only without a cluster.
  const bool vt_smem = fp8 && fp8_vt_smem && tile.cluster <= 1;
  OStore o_store = tile.o_store;
  if (o_store == OStore::kAuto) {
    o_store = fwd_smem_bytes(head_dim, head_dim_v, tile, stages, 1, true, input_bytes, vt_smem) <= kSmemLimitBytes
                  ? OStore::kOwnBuffer
                  : OStore::kRegisters;
  }
  int q_stages = tile.q_stages;
  if (q_stages == 0) {
    const bool fits = fwd_smem_bytes(head_dim, head_dim_v, tile, stages, 2, o_store == OStore::kOwnBuffer, input_bytes,
                                     vt_smem) <= kSmemLimitBytes;
    q_stages = o_store != OStore::kQBuffer && fits ? 2 : 1;
  }
  // Two consumer warpgroups that hold O for head dims of 192 and up, or hold O in
  // registers through the epilogue, need 240 each; below that 224 suffice, and the
  // producer's 56 keep its TMA coordinates out of local memory (24 spill them). The FP8
  // kernels' P takes a quarter of S's registers (e4m3, four to a register), and at head
  // dims 192 (128x128) and 256 (128x64) 224 hold O, S and P: 24 for the producer
  // spilled 20 bytes at 256.
  // FP8 consumers hold S (block_n / 2 registers a thread), O (head_dim_v / 2) and e4m3 P
  // (block_n / 8). At 224 registers ptxas fit 196 of them (hdim 192, 128x160) and
  // spilled from 204 (hdim 128, 128x224: 96 bytes; hdim 256, 128x128: 156).
  const int fp8_tile_regs = tile.block_n / 2 + head_dim_v / 2 + tile.block_n / 8;
  const bool wide = (head_dim_v >= 192 && !fp8) || o_store == OStore::kRegisters || (fp8 && fp8_tile_regs > 200);
  const int producer_regs = wgs == 2 ? (wide ? 24 : 56) : 32;
  const int consumer_regs = wgs == 2 ? (wide ? 240 : 224) : wgs == 3 ? 160 : 112;
  // Skipping O's rescale saves d/2 multiplies per row per key block but puts a warp
  // vote on the softmax's critical path. Two warpgroups at head dim 64, where the
  // softmax is the longer half of each step and one other warpgroup hides it, lost
  // 4 % on short causal rows; everywhere else it gained (docs/perf-log.md).
  const bool lazy_rescale = fp8 ? fp8_lean_softmax(head_dim) : head_dim_v > 64 || wgs > 2;
  // A warpgroup's causal diagonal ends 64 rows before the next one's. That leaves it a
  // whole key block short of the tile's last one whenever a block boundary falls in
  // between: in most tiles of three or more warpgroups or of key blocks that are not
  // a multiple of 128 (hdim 64 causal 512-4k +4-12 %, hdim 256 +1-4 %). With two
  // warpgroups and 128-key blocks it rarely happens and the check cost 1.5-3 % at
  // hdim 64 (docs/perf-log.md).
  const bool skip_blocks = wgs > 2 || tile.block_n % 128 != 0;
  // Q·Kᵀ with Q in registers reads only K from shared memory: a 64x128x16 GMMA then
  // reads 4 KB instead of 6 KB, and Q's buffer is free for the next tile's Q from the
  // tile's start. +2-3 % at hdim 128 from 2k tokens (docs/perf-log.md). Q's fragment
  // (d/4 registers) fits beside two warpgroups' 224 only up to head dim 128: three
  // warpgroups at 160 spilled 96 bytes with it at head dim 64, and the hdim 192 kernel,
  // O in registers at 240, spilled 32. Nor beside key blocks wider than 128: S, P and O
  // of a 176-key block take 196 registers, and with Q's 32 ptxas serialized the
  // mainloop's GMMAs and spilled in it (hdim 128, 128x160 and 128x176).
  const bool q_registers = !fp8 && head_dim <= 128 && wgs == 2 && tile.block_n <= 128;
  // Every query block of a head reads all of its K/V from L2: about 5 TB/s at 650
  // TFLOP/s, whose energy lowers the clock under the power cap. Two CTAs on
  // neighbouring query blocks of a head halve that by sharing each load (TMA
  // multicast), at the price of running in step: +1-3 % at head dims 96 to 256 from
  // 4k-8k keys, behind at 512-1k and at head dim 64 (docs/perf-log.md). The dispatcher
  // picks such tiles by key length; causal neighbours see different key blocks, so
  // only non-causal tiles pair up.
  const int cluster_m = tile.cluster > 1 ? tile.cluster : 1;
  return FwdConfig{tile.block_m, tile.block_n, stages, q_stages, wgs, producer_regs, consumer_regs, true, o_store,
                   lazy_rescale, skip_blocks, q_registers, cluster_m, vt_smem};
}
constexpr FwdConfig fwd_config(int head_dim, FwdTile tile) { return fwd_config(head_dim, head_dim, tile); }

}  // namespace fa3::hopper
