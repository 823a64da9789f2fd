// The backward's configurations (hopper/bwd_config.h) and workspace layout
// (hopper/bwd_workspace.h), checked on the host: every head dim's configuration fits
// the registers and shared memory it launches with and splits its GEMMs evenly, and the
// workspace's regions are aligned, disjoint, sized for what the kernels index and
// zeroed where sums start; a varlen call's sequences get blocks of their own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "api/problem.h"
#include "fa3/device.h"
#include "hopper/bwd_config.h"
#include "hopper/bwd_dispatch.h"
#include "hopper/bwd_workspace.h"

namespace fa3::hopper {
namespace {

constexpr int kHeadDims[] = {64, 96, 128, 192, 256};
constexpr int kSmemLimitBytes = 227 * 1024;

TEST(BwdConfig, EveryHeadDimFitsItsLaunch) {
  for (int d : kHeadDims) {
    SCOPED_TRACE(d);
    const BwdConfig c = bwd_config(d);
    EXPECT_TRUE(c.registers_fit());
    EXPECT_LE(c.smem_bytes(d), kSmemLimitBytes);
    EXPECT_GE(c.consumer_wgs, 2);
    EXPECT_LE(c.consumer_wgs, 3);
    // Each GEMM's warpgroups split its dimensions into 64-row atoms and whole N slices.
    EXPECT_EQ(c.consumer_wgs % c.sdp_wg_m, 0);
    EXPECT_EQ(c.consumer_wgs % c.dkv_wg_n, 0);
    EXPECT_EQ(c.consumer_wgs % c.dq_wg_m, 0);
    EXPECT_EQ(c.block_n % 16, 0);
    EXPECT_EQ(c.block_m % 16, 0);
    EXPECT_TRUE(c.do_stages == c.q_stages || c.do_stages == 1);
    EXPECT_TRUE(c.ds_stages == c.q_stages || c.ds_stages == 1);
    // dQ staged a slice at a time holds P in warpgroup 0's part of its buffer.
    if (c.p_in_dq_staging()) {
      EXPECT_EQ(c.ds_stages, 1);
      EXPECT_FALSE(c.dkv_from_registers());
      EXPECT_LE(c.block_m * c.block_n * 2, c.block_m * d * 4 / c.dq_slices / c.consumer_wgs);
    }
    // LSE and D of a query block travel by bulk copy: a multiple of 16 bytes.
    EXPECT_EQ(c.block_m * 4 % 16, 0);
  }
}

// Up to head dim 128 each warpgroup holds whole key rows of S and of dK/dV, so P and dS
// reach the dK/dV GEMMs from registers; beyond, dK/dV split the head dim.
TEST(BwdConfig, RegisterOperandsUpToHeadDim128) {
  for (int d : kHeadDims) EXPECT_EQ(bwd_config(d).dkv_from_registers(), d <= 128) << d;
}

// One of several dQ slices may leave by red from registers, the rest through the dQ
// warp: at head dim 256, the first of its two, measured faster than staging both.
TEST(BwdConfig, DqSliceByRedOnlyBesideStagedSlices) {
  for (int d : kHeadDims) {
    SCOPED_TRACE(d);
    const BwdConfig c = bwd_config(d);
    EXPECT_EQ(c.dq_red_slice, d == 256 ? 0 : -1);
    if (c.dq_red_slice < 0) continue;
    EXPECT_GT(c.dq_slices, 1);
    EXPECT_LT(c.dq_red_slice, c.dq_slices);
  }
}

// The next tile drawn late (once the current tile's loads are out): on where causal
// calls measured faster with it, everywhere but head dim 64.
TEST(BwdConfig, NextTileDrawnLateWhereMeasured) {
  for (int d : kHeadDims) EXPECT_EQ(bwd_config(d).draw_next_late, d != 64) << d;
}

BwdShape shape(std::int64_t sq, std::int64_t sk, std::int64_t hq, std::int64_t hkv, std::int64_t d) {
  return {3, sq, sk, hq, hkv, d};
}

// The overlapped tile switch stages dK in the dS buffers and dV in the dQ staging
// buffer, which needs whole key rows of dK/dV per warpgroup (and room for both): on at
// head dim 128, where it measured faster at every sequence length, off elsewhere.
TEST(BwdConfig, OverlappedTileSwitchWhereDkvLeaveFromRegisters) {
  for (int d : kHeadDims) {
    SCOPED_TRACE(d);
    const BwdConfig c = bwd_config(d);
    EXPECT_EQ(c.overlap_tile_switch, d == 128);
    if (!c.overlap_tile_switch) continue;
    EXPECT_TRUE(c.dkv_from_registers());
    EXPECT_LE(c.block_n * d, c.ds_stages * c.block_m * c.block_n);  // dK in the dS buffers
    EXPECT_LE(c.block_n * d * 2, c.block_m * d * 4 / c.dq_slices);  // dV in the dQ staging
  }
}

TEST(BwdWorkspace, RegionsAreAlignedDisjointAndSized) {
  for (bool deterministic : {false, true}) {
    for (std::int64_t hkv : {8, 2}) {
      const BwdShape s = shape(1000, 777, 8, hkv, 128);
      const BwdWorkspace w = bwd_workspace_layout(s, 64, 128, deterministic);
      SCOPED_TRACE(testing::Message() << "deterministic " << deterministic << " kv heads " << hkv);
      EXPECT_EQ(w.m_blocks, 16);
      EXPECT_EQ(w.n_blocks, 7);
      EXPECT_EQ(w.gqa, hkv != 8);
      const std::size_t regions[] = {w.dq_accum,     w.lse_log2,      w.dpsum,        w.dk_accum,
                                     w.dv_accum,     w.dq_semaphore, w.dkv_semaphore, w.tile_counter};
      for (std::size_t r : regions) EXPECT_EQ(r % BwdWorkspace::kAlign, 0u);
      for (std::size_t i = 1; i < sizeof(regions) / sizeof(regions[0]); ++i) EXPECT_LE(regions[i - 1], regions[i]);
      const std::size_t q_rows = static_cast<std::size_t>(3 * 8 * w.m_blocks * 64);
      EXPECT_GE(w.lse_log2 - w.dq_accum, q_rows * 128 * 4);
      EXPECT_GE(w.dpsum - w.lse_log2, q_rows * 4);
      EXPECT_GE(w.zero_begin - w.dpsum, q_rows * 4);
      const std::size_t k_elems = static_cast<std::size_t>(3 * hkv * w.n_blocks * 128 * 128);
      EXPECT_EQ(w.dv_accum - w.dk_accum >= k_elems * 4, w.gqa);
      EXPECT_EQ(w.dq_semaphore - w.dv_accum >= k_elems * 4, w.gqa);
      EXPECT_EQ(w.dkv_semaphore - w.dq_semaphore >= static_cast<std::size_t>(3 * 8 * w.m_blocks) * 4, deterministic);
      EXPECT_EQ(w.tile_counter - w.dkv_semaphore >= static_cast<std::size_t>(3 * hkv * w.n_blocks) * 4,
                deterministic && w.gqa);
      EXPECT_GE(w.bytes, w.tile_counter + 4);
      // What sums start from is zeroed: the dK/dV accumulators, counters, tile counter.
      EXPECT_EQ(w.zero_begin, w.dk_accum);
    }
  }
}

TEST(BwdWorkspace, GrowsOnlyWithWhatTheCallNeeds) {
  const std::size_t plain = bwd_workspace_layout(shape(512, 512, 8, 8, 64), 128, 128, false).bytes;
  EXPECT_GT(bwd_workspace_layout(shape(512, 512, 8, 2, 64), 128, 128, false).bytes, plain);
  EXPECT_GT(bwd_workspace_layout(shape(512, 512, 8, 8, 64), 128, 128, true).bytes, plain);
  EXPECT_EQ(bwd_workspace_layout(shape(513, 512, 8, 8, 64), 128, 128, false).m_blocks, 5);
}

// A varlen call's sequences (first_block): each sequence's blocks, as many as its rows
// need, lie inside the head's q_blocks / k_blocks and after the previous sequence's,
// whatever the lengths (0, 1, block multiples and not); dK/dV are summed in the
// accumulators with GQA only (MHA tiles write theirs by row copies); the grids' blocks
// are those of the longest sequence.
TEST(BwdWorkspace, VarlenSequencesHaveBlocksOfTheirOwn) {
  const std::vector<std::int64_t> lengths = {0, 1, 63, 64, 65, 127, 128, 129, 0, 3, 256, 1, 1000};
  for (int block : {64, 80, 128}) {
    std::int64_t total = 0, longest = 0;
    for (std::int64_t n : lengths) {
      total += n;
      longest = std::max(longest, n);
    }
    const BwdShape s{static_cast<std::int64_t>(lengths.size()), longest, longest, 8, 2, 128, true, total + 37,
                     total + 37};
    const BwdWorkspace w = bwd_workspace_layout(s, block, block, true);
    SCOPED_TRACE(testing::Message() << "block " << block);
    EXPECT_TRUE(w.dkv_sums);
    BwdShape mha = s;
    mha.nheads_kv = 8;
    const BwdWorkspace wm = bwd_workspace_layout(mha, block, block, true);
    EXPECT_FALSE(wm.dkv_sums);
    EXPECT_EQ(wm.dv_accum, wm.dk_accum);
    EXPECT_EQ(wm.dq_semaphore, wm.dv_accum);
    EXPECT_EQ(wm.tile_counter, wm.dkv_semaphore);
    EXPECT_EQ(w.regions, 1);
    EXPECT_EQ(w.m_blocks, (longest + block - 1) / block);
    std::int64_t offset = 0, next_free = 0;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const std::int64_t first = first_block(offset, static_cast<std::int64_t>(b), block);
      const std::int64_t blocks = (lengths[b] + block - 1) / block;
      EXPECT_GE(first, next_free) << "sequence " << b;
      EXPECT_LE(first + blocks, w.q_blocks) << "sequence " << b;
      EXPECT_LE(first + blocks, w.k_blocks) << "sequence " << b;
      next_free = first + blocks;
      offset += lengths[b];
    }
    EXPECT_GE(w.dpsum - w.lse_log2, static_cast<std::size_t>(8 * w.q_blocks * block) * 4);
    EXPECT_GE(w.dv_accum - w.dk_accum, static_cast<std::size_t>(2 * w.k_blocks * block * 128) * 4);
    EXPECT_GE(w.dkv_semaphore - w.dq_semaphore, static_cast<std::size_t>(8 * w.q_blocks) * 4);
    EXPECT_GE(w.tile_counter - w.dkv_semaphore, static_cast<std::size_t>(2 * w.k_blocks) * 4);
  }
}

// A varlen backward call runs on a varlen instance (at the head dims of
// FA3_BWD_VARLEN_HEAD_DIMS, which BuildInfo reports): its own family's where one is built
// (FA3_BWD_VARLEN_OWN_HEAD_DIMS), else the general family's; a fixed-length call on its
// own family, never on a varlen one.
TEST(BwdDispatch, VarlenCallsRunOnAVarlenInstance) {
  const std::vector<int>& listed = build_info().gpu_varlen_backward_head_dims;
  if (!bwd_varlen_enabled()) EXPECT_TRUE(listed.empty());
  for (int d : kHeadDims) {
    bool in_registry = false;
    for (const BwdKernelEntry& k : bwd_kernels()) in_registry |= k.varlen && k.head_dim == d;
    EXPECT_EQ(bwd_runs_varlen(d), in_registry) << d;
    // The kernel filter may leave a listed head dim out, never add one.
    if (in_registry) EXPECT_NE(std::find(listed.begin(), listed.end(), d), listed.end()) << d;
  }
  const std::vector<int> dims = bwd_varlen_head_dims();
  EXPECT_TRUE(std::is_sorted(dims.begin(), dims.end()));
  for (const BwdKernelEntry& k : bwd_kernels()) {
    if (k.varlen) EXPECT_TRUE(bwd_runs_varlen(k.head_dim)) << k.head_dim;
  }
  for (bool causal : {false, true}) {
    Problem p;
    p.batch = 2;
    p.seqlen_q = p.seqlen_k = 1000;
    p.nheads_q = p.nheads_kv = 4;
    p.head_dim = p.head_dim_v = 128;
    p.softmax_scale = 0.1f;
    p.causal = causal;
    p.window_right = causal ? 0 : -1;
    const MaskKind own = causal ? MaskKind::kCausal : MaskKind::kPlain;
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      p.varlen = false;
      EXPECT_EQ(bwd_mask_kind(p, dtype), own);
      p.varlen = true;
      bool own_varlen = false;
      for (const BwdKernelEntry& k : bwd_kernels()) {
        own_varlen |= k.varlen && k.dtype == dtype && k.head_dim == 128 && k.mask == own;
      }
      EXPECT_EQ(bwd_mask_kind(p, dtype), own_varlen ? own : MaskKind::kGeneral);
    }
  }
}

}  // namespace
}  // namespace fa3::hopper
