// fa3 — fp8::quantize on the CPU, step by step as fa3/fp8.h defines it: the oracle the
// GPU kernel is checked against, bit for bit.
#pragma once

#include <cstdint>

#include "fa3/fp8.h"

namespace fa3::reference {

// Row `x` (head_dim values) through step 1 of fa3/fp8.h, in place.
void hadamard_rotate(float* x, int head_dim, std::uint64_t seed);

// Writes args.output and args.scale; `args` validated (api/fp8.cpp).
void fp8_quantize(const fp8::QuantizeArgs& args);

}  // namespace fa3::reference
