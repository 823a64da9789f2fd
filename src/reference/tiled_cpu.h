// fa3 — the CPU fallback: tiled two-level online softmax (fp32 accumulation),
// multi-threaded over (batch, head, query block). The path `fa3 run` uses when no
// GPU is present; mirrors the GPU kernel's algorithm so it can be read as its model.
#pragma once

#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"

namespace fa3::reference {

struct TiledCpuConfig {
  int block_m = 64;     // query rows per tile
  int block_n = 64;     // keys per inner block
  int num_threads = 0;  // 0: std::thread::hardware_concurrency()
};

// Writes args.out (and args.lse when given), with args.sinks when given. `p` comes from
// validate_forward. e4m3 inputs run the FP8 kernel's numerics (fa3/attention.h): their
// scales applied as rows are loaded, P rounded to e4m3 for P V, the sum in fp32.
void tiled_forward(const Problem& p, const ForwardArgs& args, const TiledCpuConfig& config = {});

// One fixed-length problem and its arguments: a whole call, or one sequence of a varlen
// call (reference/varlen.h).
struct TiledTask {
  Problem problem;
  ForwardArgs args;
};

// Runs the query blocks of every task on one pool of threads, so that many short
// sequences keep the threads as busy as one long one. The tasks share their head dims.
void tiled_forward(const std::vector<TiledTask>& tasks, const TiledCpuConfig& config = {});

}  // namespace fa3::reference
