// fa3 — the CPU fallback: tiled two-level online softmax (fp32 accumulation),
// multi-threaded over (batch, head, query block). The path `fa3 run` uses when no
// GPU is present; mirrors the GPU kernel's algorithm so it can be read as its model.
#pragma once

#include "api/problem.h"
#include "fa3/attention.h"

namespace fa3::reference {

struct TiledCpuConfig {
  int block_m = 64;     // query rows per tile
  int block_n = 64;     // keys per inner block
  int num_threads = 0;  // 0: std::thread::hardware_concurrency()
};

// Writes args.out (and args.lse when given), with args.sinks when given. `p` comes from
// validate_forward.
void tiled_forward(const Problem& p, const ForwardArgs& args, const TiledCpuConfig& config = {});

}  // namespace fa3::reference
