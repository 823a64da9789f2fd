// The forward kernel's configuration (hopper/fwd_config.h), checked on the host: every
// tile the build may compile fits Hopper's shared memory and register file, Q gets a
// second buffer where it fits, and forced choices are kept. A configuration over the
// shared-memory limit fails only at launch on a GPU; these catch it on any machine.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hopper/fwd_config.h"

namespace fa3::hopper {
namespace {

struct TileCase {
  int head_dim;
  FwdTile tile;
};

// The default tiles of src/CMakeLists.txt and the variants measured in the perf log.
std::vector<TileCase> tiles() {
  return {
      {64, {192, 128}},  {64, {256, 64}},   {64, {128, 128}},   {96, {128, 128}},   {128, {128, 128}},
      {128, {128, 176}}, {192, {128, 96}},  {256, {128, 80}},   {256, {128, 64}},
      {128, {128, 128, OStore::kRegisters, 3}}, {128, {128, 128, OStore::kRegisters, 2, 2}},
      {64, {192, 128, OStore::kAuto, 3}},       {256, {128, 80, OStore::kRegisters}},
  };
}

int smem_bytes(int head_dim, const FwdConfig& c) {
  return fwd_smem_bytes(head_dim, FwdTile{c.block_m, c.block_n}, c.stages, c.q_stages,
                        c.o_store == OStore::kOwnBuffer);
}

TEST(FwdConfig, EveryTileFitsSharedMemoryAndRegisters) {
  for (const TileCase& t : tiles()) {
    SCOPED_TRACE("hdim " + std::to_string(t.head_dim) + " " + std::to_string(t.tile.block_m) + "x" +
                 std::to_string(t.tile.block_n));
    const FwdConfig c = fwd_config(t.head_dim, t.tile);
    EXPECT_LE(smem_bytes(t.head_dim, c), kSmemLimitBytes);
    EXPECT_TRUE(c.registers_fit());
    EXPECT_EQ(c.consumer_wgs * 64, c.block_m);
    EXPECT_NE(c.o_store, OStore::kAuto);
    EXPECT_TRUE(c.q_stages == 1 || c.q_stages == 2);
    // O written through Q's buffer would be overwritten by the next tile's Q.
    if (c.o_store == OStore::kQBuffer) EXPECT_EQ(c.q_stages, 1);
  }
}

TEST(FwdConfig, RegisterBudgetsByWhatTheConsumersHold) {
  // Two consumer warpgroups holding O for head dims up to 128 take 224 each and leave
  // the producer 56; wider O, or O kept in registers for the epilogue, takes 240.
  for (const TileCase& t : std::vector<TileCase>{{64, {128, 128}}, {96, {128, 128}}, {128, {128, 128}}}) {
    const FwdConfig c = fwd_config(t.head_dim, t.tile);
    EXPECT_EQ(c.consumer_regs, 224) << t.head_dim;
    EXPECT_EQ(c.producer_regs, 56) << t.head_dim;
  }
  // 128x176 at hdim 128 has no room for O's buffer, so O leaves from registers too.
  for (const TileCase& t : std::vector<TileCase>{{192, {128, 96}}, {256, {128, 80}}, {256, {128, 64}},
                                                 {128, {128, 176}}, {128, {128, 128, OStore::kRegisters, 3}}}) {
    const FwdConfig c = fwd_config(t.head_dim, t.tile);
    EXPECT_EQ(c.consumer_regs, 240) << t.head_dim;
    EXPECT_EQ(c.producer_regs, 24) << t.head_dim;
  }
  // Three consumer warpgroups launch at 128 per thread: 32 + 3 * 160.
  const FwdConfig three = fwd_config(64, {192, 128});
  EXPECT_EQ(three.consumer_regs, 160);
  EXPECT_EQ(three.producer_regs, 32);
  // Four launch at 96 per thread: 32 + 4 * 112.
  const FwdConfig four = fwd_config(64, {256, 64});
  EXPECT_EQ(four.consumer_wgs, 4);
  EXPECT_EQ(four.threads(), 640);
  EXPECT_EQ(four.consumer_regs, 112);
  EXPECT_EQ(four.producer_regs, 32);
  // Every budget is a multiple of 8 (setmaxnreg) and uses the whole launch allocation.
  for (const TileCase& t : tiles()) {
    const FwdConfig c = fwd_config(t.head_dim, t.tile);
    EXPECT_EQ(c.producer_regs % 8, 0);
    EXPECT_EQ(c.consumer_regs % 8, 0);
    EXPECT_EQ(128 * (c.producer_regs + c.consumer_wgs * c.consumer_regs), c.threads() * c.launch_regs());
  }
}

TEST(FwdConfig, LazyRescaleExceptTwoWarpgroupsAtHeadDim64) {
  // Measured: the warp vote of the lazy rescale cost 4 % on the two-warpgroup head dim
  // 64 tile (short causal rows) and gained elsewhere.
  EXPECT_FALSE(fwd_config(64, {128, 128}).lazy_rescale);
  EXPECT_TRUE(fwd_config(64, {192, 128}).lazy_rescale);
  EXPECT_TRUE(fwd_config(64, {256, 64}).lazy_rescale);
  for (const TileCase& t : tiles()) {
    if (t.head_dim > 64) EXPECT_TRUE(fwd_config(t.head_dim, t.tile).lazy_rescale) << t.head_dim;
  }
}

TEST(FwdConfig, SkippedKeyBlocksWhereWarpgroupDiagonalsEndBlocksApart) {
  // Three or more warpgroups, or key blocks that are not a multiple of 128: a
  // warpgroup's causal diagonal often ends a whole key block before the tile's. Two
  // warpgroups with 128-key blocks: rarely, and the check measured slower.
  EXPECT_TRUE(fwd_config(64, {192, 128}).skip_blocks);
  EXPECT_TRUE(fwd_config(64, {256, 64}).skip_blocks);
  EXPECT_TRUE(fwd_config(192, {128, 96}).skip_blocks);
  EXPECT_TRUE(fwd_config(256, {128, 80, OStore::kRegisters}).skip_blocks);
  EXPECT_TRUE(fwd_config(256, {128, 64}).skip_blocks);
  EXPECT_FALSE(fwd_config(64, {128, 128}).skip_blocks);
  EXPECT_FALSE(fwd_config(128, {128, 128}).skip_blocks);
}

TEST(FwdConfig, QueryInRegistersForTwoWarpgroupsUpToHeadDim128) {
  // Q's fragment takes d/4 registers per thread: it fits beside two warpgroups' 224 up
  // to head dim 128, not beside three warpgroups' 160 (spilled at head dim 64) nor
  // beside O at head dim 192 (spilled) and 256, nor beside key blocks wider than 128
  // (serialized GMMAs at 128x160 and 128x176).
  const struct {
    TileCase tile;
    bool q_registers;
  } cases[] = {{{64, {128, 128}}, true},   {{96, {128, 128}}, true},  {{128, {128, 128}}, true},
               {{128, {128, 128, OStore::kQBuffer}}, true},         {{64, {192, 128}}, false},
               {{64, {256, 64}}, false},   {{192, {128, 96}}, false}, {{256, {128, 80}}, false},
               {{256, {128, 64}}, false},  {{128, {128, 160}}, false}, {{128, {128, 176}}, false}};
  for (const auto& c : cases) {
    EXPECT_EQ(fwd_config(c.tile.head_dim, c.tile.tile).q_registers, c.q_registers)
        << c.tile.head_dim << " " << c.tile.tile.block_m << "x" << c.tile.tile.block_n;
  }
}

TEST(FwdConfig, SharedKeyValueLoadsOnlyWhereTheTileAsks) {
  for (const TileCase& t : tiles()) EXPECT_EQ(fwd_config(t.head_dim, t.tile).cluster_m, 1) << t.head_dim;
  EXPECT_EQ(fwd_config(128, {128, 128, OStore::kAuto, 0, 0, 2}).cluster_m, 2);
  EXPECT_EQ(fwd_config(256, {128, 80, OStore::kAuto, 0, 0, 2}).cluster_m, 2);
  EXPECT_EQ(fwd_config(128, {128, 128, OStore::kAuto, 0, 0, 1}).cluster_m, 1);
}

TEST(FwdConfig, SecondQBufferWhereItFits) {
  // hdim 64-128: O keeps its own buffer and Q gets two (hdim 128: 2*32 + 2*2*32 + 32 KB).
  for (const TileCase& t : std::vector<TileCase>{{64, {192, 128}}, {64, {256, 64}}, {64, {128, 128}},
                                                 {96, {128, 128}}, {128, {128, 128}}}) {
    const FwdConfig c = fwd_config(t.head_dim, t.tile);
    EXPECT_EQ(c.o_store, OStore::kOwnBuffer) << t.head_dim;
    EXPECT_EQ(c.q_stages, 2) << t.head_dim;
    // Four warpgroups pass through their 64-key blocks fast enough to want a third stage.
    EXPECT_EQ(c.stages, c.consumer_wgs == 4 ? 3 : 2) << t.head_dim;
  }
  // hdim 192/256: Q and two K/V stages leave no room for O, which leaves from
  // registers; a second Q buffer does not fit either.
  for (const TileCase& t : std::vector<TileCase>{{192, {128, 96}}, {256, {128, 80}}, {256, {128, 64}}}) {
    const FwdConfig c = fwd_config(t.head_dim, t.tile);
    EXPECT_EQ(c.o_store, OStore::kRegisters) << t.head_dim;
    EXPECT_EQ(c.q_stages, 1) << t.head_dim;
  }
}

TEST(FwdConfig, ForcedChoicesAreKept) {
  const FwdConfig regs3 = fwd_config(128, {128, 128, OStore::kRegisters, 3});
  EXPECT_EQ(regs3.o_store, OStore::kRegisters);
  EXPECT_EQ(regs3.stages, 3);
  EXPECT_EQ(regs3.q_stages, 1);  // 32 + 3*2*32 KB leaves no room for a second Q
  const FwdConfig one_q = fwd_config(128, {128, 128, OStore::kAuto, 0, 1});
  EXPECT_EQ(one_q.o_store, OStore::kOwnBuffer);
  EXPECT_EQ(one_q.q_stages, 1);
  const FwdConfig in_q = fwd_config(128, {128, 128, OStore::kQBuffer});
  EXPECT_EQ(in_q.o_store, OStore::kQBuffer);
  EXPECT_EQ(in_q.q_stages, 1);
}

TEST(FwdConfig, SharedMemoryCountsEveryBuffer) {
  // hdim 128, 128x128: Q 32 KB per buffer, K and V 32 KB per stage each, O 32 KB.
  constexpr int kKB = 1024;
  EXPECT_EQ(fwd_smem_bytes(128, {128, 128}, 2, 1, false), 160 * kKB + kSmemReserveBytes);
  EXPECT_EQ(fwd_smem_bytes(128, {128, 128}, 2, 2, true), 224 * kKB + kSmemReserveBytes);
  EXPECT_EQ(fwd_smem_bytes(256, {128, 80}, 2, 1, false), 224 * kKB + kSmemReserveBytes);
}

// The FP8 tiles of src/CMakeLists.txt (e4m3 inputs, 16-bit O): within shared memory and
// the register file, O through its own buffer with a second Q buffer, Q·Kᵀ from shared
// memory, the plain online softmax (P's 2^8 shift), and the 56 / 224 split everywhere.
TEST(FwdConfig, Fp8TilesFitAndKeepTheirRules) {
  constexpr int kKB = 1024;
  for (const TileCase& t : std::vector<TileCase>{
           {64, {128, 128}}, {96, {128, 128}}, {128, {128, 128}}, {192, {128, 128}}, {256, {128, 64}}}) {
    SCOPED_TRACE("hdim " + std::to_string(t.head_dim));
    const FwdConfig c = fwd_config(t.head_dim, t.head_dim, t.tile, 1);
    EXPECT_LE(fwd_smem_bytes(t.head_dim, t.head_dim, t.tile, c.stages, c.q_stages, c.o_store == OStore::kOwnBuffer, 1),
              kSmemLimitBytes);
    EXPECT_TRUE(c.registers_fit());
    EXPECT_EQ(c.o_store, OStore::kOwnBuffer);
    EXPECT_EQ(c.q_stages, 2);
    EXPECT_FALSE(c.q_registers);
    EXPECT_EQ(c.lazy_rescale, fp8_lean_softmax(t.head_dim));
    EXPECT_EQ(c.producer_regs, 56);
    EXPECT_EQ(c.consumer_regs, 224);
  }
  // hdim 128, 128x128 in e4m3: Q 16 KB per buffer, K and V 16 KB per stage each, O 32 KB.
  EXPECT_EQ(fwd_smem_bytes(128, 128, {128, 128}, 2, 2, true, 1), 128 * kKB + kSmemReserveBytes);
  // hdim 192, 128x128: Q 24 KB per buffer, K and V 24 KB per stage each, O 48 KB.
  EXPECT_EQ(fwd_smem_bytes(192, 192, {128, 128}, 2, 2, true, 1), 192 * kKB + kSmemReserveBytes);
}

// The next causal tile drawn late (lead 0) where bf16 calls measured faster with it:
// head dims 64 and 256 at every length, 128 at up to 512 keys, 192 from 4k keys; drawn
// as the current tile starts (-1) elsewhere and in the FP8 kernels, never measured.
TEST(FwdConfig, NextTileDrawnLateWhereMeasured) {
  for (int keys : {1, 512, 513, 2048, 4095, 4096, 16384}) {
    SCOPED_TRACE("keys " + std::to_string(keys));
    EXPECT_EQ(fwd_draw_lead(64, keys, false), 0);
    EXPECT_EQ(fwd_draw_lead(96, keys, false), -1);
    EXPECT_EQ(fwd_draw_lead(128, keys, false), keys <= 512 ? 0 : -1);
    EXPECT_EQ(fwd_draw_lead(192, keys, false), keys >= 4096 ? 0 : -1);
    EXPECT_EQ(fwd_draw_lead(256, keys, false), 0);
    for (int d : {64, 96, 128, 192, 256}) EXPECT_EQ(fwd_draw_lead(d, keys, true), -1) << d;
  }
}

}  // namespace
}  // namespace fa3::hopper
