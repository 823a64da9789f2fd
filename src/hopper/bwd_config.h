// fa3 — backward kernel configurations: tile shapes, how the warpgroups split each of
// the five GEMMs of a step, pipeline depths and register budgets, one per head dim.
//
// A CTA owns a block of block_n keys of one head (its dK and dV stay in registers) and
// walks the query blocks that see them, block_m rows at a time. Each step runs
//   S = Q·Kᵀ, dP = dO·Vᵀ  (block_m x block_n),
//   dV += Pᵀ·dO, dK += dSᵀ·Q  (block_n x d),   dQ = dS·K  (block_m x d, summed across CTAs).
// The warpgroups split each GEMM along one or two of its output dimensions. Computing
// S and dP transposed (Sᵀ = K·Qᵀ, sdp_swap) gives each warpgroup whole key rows, so
// that Pᵀ and dSᵀ are already the A operands of the dV and dK GEMMs in its registers
// (no trip through shared memory). That holds dK and dV in d registers per thread,
// too many beyond head dim 128, where the dK/dV GEMMs split the head dim instead
// (dkv_swap) and P and dS go through shared memory.
#pragma once

#include "hopper/fwd_config.h"

namespace fa3::hopper {

struct BwdConfig {
  int block_m;        // query rows per step
  int block_n;        // keys per tile
  int consumer_wgs;   // consumer warpgroups
  int q_stages;       // Q (with its LSE) ring depth
  int do_stages;      // dO (with its D = rowsum(dO∘O)) ring depth; q_stages or 1
  int ds_stages;      // shared-memory buffers of P and dS; q_stages or 1
  bool sdp_swap;      // S and dP computed transposed: keys are the GEMM's M
  bool dkv_swap;      // dVᵀ = dOᵀ·P and dKᵀ = Qᵀ·dS: the head dim is the GEMM's M
  bool dq_swap;       // dQᵀ = Kᵀ·dSᵀ: the head dim is the GEMM's M
  int sdp_wg_m;       // warpgroups along the query dim of S and dP (the rest split keys)
  int dkv_wg_n;       // warpgroups along the key dim of dK and dV (the rest split head dim)
  int dq_wg_m;        // warpgroups along the query dim of dQ (the rest split head dim)
  int dq_slices;      // dQ's GEMM issued and staged in this many row blocks, each summed before the next
  int producer_regs;  // setmaxnreg for the producer warpgroup
  int consumer_regs;  // setmaxnreg for each consumer warpgroup
  // The switch between tiles overlapped with its epilogue: K's and V's buffers released
  // once the last step's GEMMs are done, dK/dV (MHA) leaving from the dS and dQ staging
  // buffers, the next tile's K/V asked of the L2 ahead of their loads. Needs the dK/dV
  // accumulators in registers (dkv_from_registers). Measured per head dim
  // (docs/perf-log.md): kept where it was faster at every length.
  bool overlap_tile_switch = false;
  // The consumers' GEMM operands in shared memory sliced by a warp-uniform warpgroup
  // index (a broadcast): their descriptors are then built in uniform registers, not in
  // regular ones moved over before every GEMM (R2UR), which frees registers for the
  // step. Measured per head dim (docs/perf-log.md): kept where it was faster.
  bool uniform_slices = false;
  bool varlen = false;  // carries the varlen paths (see the end of this file); set by launch_bwd
  // The dQ slice (0 .. dq_slices - 1) that leaves by red from the consumers' registers
  // instead of through the staging buffer and the dQ warp's bulk reduce-add; -1: none.
  // The staged slices' reads then have the rest of the step to finish before the
  // buffer is written again, where one slice after another waited for the last one's.
  // Deterministic calls stage every slice (their ordered sums are the dQ warp's).
  int dq_red_slice = -1;
  // The producer draws a CTA's next tile (dynamic order: causal and general masks) when
  // the current tile's last loads are out, not as the tile starts: a tile drawn early is
  // held for the whole current tile, and at the end of a call whose tiles differ in
  // length a CTA could start a long held tile while the others had run out of work.
  // Measured per head dim (docs/perf-log.md): on at 96 to 256 (causal hdim 128 +1-5 %
  // at 512-2k and 8k-16k); at 64 causal calls of 1k and 8k keys lost 1.5-2.5 % with
  // it, twice, so it stays off there. Deterministic calls draw late at every head dim
  // (BwdKernel::produce).
  bool draw_next_late = false;

  constexpr int threads() const { return 128 * (consumer_wgs + 1); }
  constexpr int consumer_threads() const { return 128 * consumer_wgs; }
  constexpr int launch_regs() const { return 65536 / threads() / 8 * 8; }
  constexpr bool registers_fit() const {
    return 128 * (producer_regs + consumer_wgs * consumer_regs) <= threads() * launch_regs();
  }
  // Pᵀ and dSᵀ reach the dV and dK GEMMs from registers: each warpgroup holds whole
  // key rows of S and of dK/dV.
  constexpr bool dkv_from_registers() const {
    return sdp_swap && !dkv_swap && sdp_wg_m == 1 && dkv_wg_n == consumer_wgs;
  }
  // dQ staged one slice at a time shares its buffer with P (the dV GEMM is done with
  // P before dQ's first slice is complete, and P is written again only after the last
  // slice has left): warpgroup 0's part of the buffer holds P.
  constexpr bool p_in_dq_staging() const { return dq_slices > 1; }
  // Shared memory of the operand buffers, in bytes (2-byte elements).
  constexpr int smem_bytes(int head_dim) const {
    const int kv = 2 * block_n * head_dim * 2;
    const int q_do = (q_stages + do_stages) * block_m * head_dim * 2;
    const int pds = (dkv_from_registers() || p_in_dq_staging() ? 1 : 2) * ds_stages * block_m * block_n * 2;
    const int dq = block_m * head_dim * 4 / dq_slices;
    const int stats = 2 * q_stages * block_m * 4;
    return kv + q_do + pds + dq + stats;
  }
};

// The configuration of each head dim, after FlashAttention-3's published choices for
// Hopper. Operand buffers (smem_bytes): 64: 194 KB; 96: 153 KB; 128: 193 KB; 192:
// 217 KB; 256: 219 KB (dQ staged a slice at a time, 32 KB holding P too: its whole
// 64 KB does not fit).
constexpr BwdConfig bwd_config(int head_dim) {
  switch (head_dim) {
    case 64: return {128, 128, 2, 2, 2, 2, true, false, false, 1, 2, 2, 1, 24, 240, false, true};
    case 96: return {64, 128, 2, 2, 2, 2, true, false, false, 1, 2, 1, 1, 24, 240, false, false, false, -1, true};
    case 128: return {64, 128, 2, 2, 2, 2, true, false, false, 1, 2, 1, 1, 24, 240, true, false, false, -1, true};
    case 192: return {64, 96, 3, 2, 1, 1, false, true, false, 1, 1, 1, 1, 32, 160, false, true, false, -1, true};
    // dK and dV hold 160 registers per thread here; dQ's 64 more spilled 500 bytes, so
    // dQ goes in two halves of the head dim, 32 registers each. The first half leaves by
    // red while dK's GEMM runs, the second through the staging buffer: staged one after
    // the other, the second waited for the first's reads (docs/perf-log.md).
    default: return {64, 80, 2, 2, 1, 1, false, true, true, 1, 1, 1, 2, 24, 240, false, true, false, 0, true};
  }
}

// The main kernel and the dQ conversion launch as programmatic dependents (the build's
// FA3_BWD_PDL, off: docs/perf-log.md). The preprocess lets the main kernel launch
// as soon as every preprocess CTA has started, so that the main kernel's CTAs take SMs
// as the last preprocess CTAs leave them and set up their barriers meanwhile; the dQ
// conversion launches as the main kernel's CTAs exit (no early trigger there: its CTAs
// would wait on the SMs that sm_margin leaves free). Each waits for the kernel before it
// to complete before touching what it wrote.
#ifdef FA3_BWD_PDL
inline constexpr bool kBwdPdl = true;
#else
inline constexpr bool kBwdPdl = false;
#endif

// The producer's Q and dO loads and the dQ warp's sums carry the L2's evict-last policy
// (the build's FA3_BWD_L2_EVICT_LAST, off: level to 1 % faster at head dim 64, inside the
// spread of its runs). Every tile of a head reads all of its Q and dO and adds into all
// of its dQ sums, while K, V, dK and dV pass through once; at long rows a head group's
// Q, dO and sums (8 MB a head at head dim 64 16k) outgrow the L2's share, and the policy
// keeps the ones read again ahead of the lines that pass through. FlashAttention-3 marks
// the same three.
#ifdef FA3_BWD_L2_EVICT_LAST
inline constexpr bool kBwdL2EvictLast = true;
#else
inline constexpr bool kBwdL2EvictLast = false;
#endif

// Deterministic non-causal calls start each tile of a round at a query block of its own
// (the build's FA3_BWD_SPREAD_STARTS; BwdKernel::QueryWalk, hopper/bwd_dq_order.h). Off:
// on an H100 it made deterministic calls 14-22 % faster from 1k to 4k tokens at head
// dim 64 but 12 % slower at 16k, and the code it adds to the producer and dQ warps cost
// default calls at head dim 128 1.5-2 % from 4k (docs/perf-log.md). Without it the
// kernels carry none of its code.
#ifdef FA3_BWD_SPREAD_STARTS
inline constexpr bool kBwdSpreadStarts = true;
#else
inline constexpr bool kBwdSpreadStarts = false;
#endif

// Varlen calls: in a build with FA3_GPU_VARLEN (kVarlenKernels), the head dims of the
// FA3_BWD_VARLEN_HEAD_DIMS list get a second instance of the general kernel that carries
// the varlen paths (BwdConfig::varlen), which varlen calls of every mask run on
// (bwd_dispatch.cpp), or at the head dims of FA3_BWD_VARLEN_OWN_HEAD_DIMS those of the
// plain and causal masks on varlen instances of their own families (which take the
// dynamic tile order, BwdKernel::Scheduler); varlen calls of other head dims are
// refused. The kernels of fixed-length calls never carry the paths: they run at their
// register limit (a 24-register producer beside two consumer warpgroups at 240), and the
// paths made them spill more (at head dim 128, 68 bytes of spill stores where the plain
// kernel spills 40; the general kernel 242 where it spills 170) and cost fixed-length
// window and chunk calls 3-4 % (docs/perf-log.md).

}  // namespace fa3::hopper
