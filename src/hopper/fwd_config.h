// fa3 — forward kernel configurations: tile shapes, pipeline depth, warpgroup roles
// and register budgets. A configuration follows from (head dim, tile) by the rules
// below; which tiles are compiled is the build's choice (src/CMakeLists.txt) and
// which one runs is the dispatcher's (fwd_dispatch.cpp).
//
// Shared memory per CTA (bf16/fp16): Q block_m*d*2, K and V stages*block_n*d*2 each,
// O block_m*d*2 unless it reuses Q's buffer. The Hopper limit is 227 KB.
#pragma once

namespace fa3::hopper {

// The CTA tile: query rows (64 per consumer warpgroup) by keys per K/V block.
struct FwdTile {
  int block_m;
  int block_n;
};

struct FwdConfig {
  int block_m;             // query rows per CTA tile (64 per consumer warpgroup)
  int block_n;             // keys per K/V block
  int stages;              // K/V shared-memory ring depth
  int consumer_wgs;        // consumer warpgroups (block_m / 64)
  int producer_regs;       // setmaxnreg for the producer warpgroup
  int consumer_regs;       // setmaxnreg for each consumer warpgroup
  bool pingpong;           // order consumer warpgroups' GEMMs with named barriers
  bool o_aliases_q;        // write O through Q's shared buffer (when O would not fit)

  constexpr int threads() const { return 128 * (consumer_wgs + 1); }
  // Registers per thread at launch: the register file split evenly, in units of 8.
  constexpr int launch_regs() const { return 65536 / threads() / 8 * 8; }
  // setmaxnreg.inc blocks until the registers it asks for are free, so the budgets
  // must fit in what the CTA was launched with, or the consumers wait forever.
  constexpr bool registers_fit() const {
    return 128 * (producer_regs + consumer_wgs * consumer_regs) <= threads() * launch_regs();
  }
};

inline constexpr int kSmemLimitBytes = 227 * 1024;
// Barriers and alignment padding on top of the operand buffers.
inline constexpr int kSmemReserveBytes = 2048;

constexpr int fwd_smem_bytes(int head_dim, FwdTile tile, int stages, bool o_aliases_q) {
  const int q = tile.block_m * head_dim * 2;
  const int kv = 2 * stages * tile.block_n * head_dim * 2;
  return q + kv + (o_aliases_q ? 0 : q) + kSmemReserveBytes;
}

// Register budgets, each a multiple of 8 in [24, 256] with registers_fit(): two
// consumer warpgroups launch at 168 per thread (64512 in all) = 24 + 2 * 240; three at
// 128 per thread = 32 + 3 * 160. O gets its own buffer whenever it fits, so that Q's
// can be refilled for the next tile while this one finishes.
constexpr FwdConfig fwd_config(int head_dim, FwdTile tile) {
  const int wgs = tile.block_m / 64;
  const int stages = 2;
  const bool alias = fwd_smem_bytes(head_dim, tile, stages, false) > kSmemLimitBytes;
  return FwdConfig{tile.block_m, tile.block_n, stages, wgs, wgs == 2 ? 24 : 32, wgs == 2 ? 240 : 160, true, alias};
}

}  // namespace fa3::hopper
