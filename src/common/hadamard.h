// fa3 — the pieces of fa3/fp8.h's random-sign Hadamard transform that the CPU version
// and the GPU kernel share, so that both draw the same signs and sizes.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace fa3::hadamard {

// splitmix64's finaliser: a well-mixed 64-bit hash, cheap on either side.
FA3_HOST_DEVICE inline std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Column c's sign is -1 when the top bit of the hash of (seed, c) is set.
FA3_HOST_DEVICE inline bool negative(std::uint64_t seed, int column) {
  return (mix(seed + 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(column + 1)) >> 63) != 0;
}

FA3_HOST_DEVICE inline int block_size(int head_dim) { return head_dim & -head_dim; }

}  // namespace fa3::hadamard
