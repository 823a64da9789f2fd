// fa3 — forward kernel configurations: tile shapes, pipeline depth, warpgroup roles
// and register budgets, one named struct per head dim.
//
// Shared memory per CTA (bf16/fp16): Q block_m*d*2, K and V stages*block_n*d*2 each,
// O block_m*d*2 unless it reuses Q's buffer. The Hopper limit is 227 KB.
#pragma once

namespace fa3::hopper {

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

// Register budgets: each a multiple of 8 in [24, 256], and registers_fit(). With two
// consumer warpgroups the CTA launches at 168 per thread (64512 in all): 24 + 2 * 240.
template <int kHeadDim, bool kCausal>
constexpr FwdConfig fwd_config() {
  if constexpr (kHeadDim == 64) {
    return FwdConfig{192, 128, 2, 3, 32, 160, true, false};
  } else if constexpr (kHeadDim == 96) {
    return FwdConfig{128, 128, 2, 2, 24, 240, true, false};
  } else if constexpr (kHeadDim == 128) {
    return FwdConfig{128, 128, 2, 2, 24, 240, true, false};
  } else if constexpr (kHeadDim == 192) {
    return FwdConfig{128, 96, 2, 2, 24, 240, true, true};
  } else {
    static_assert(kHeadDim == 256, "head dims: 64, 96, 128, 192, 256");
    return FwdConfig{128, 80, 2, 2, 24, 240, true, true};
  }
}

}  // namespace fa3::hopper
