// What the ring's GPU tests share: counting Hopper GPUs, the whole-sequence positions of
// each rank's shard, and moving rows between whole-sequence host data and a shard's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace fa3::test {

inline int hopper_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  int hoppers = 0;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess && prop.major == 9) ++hoppers;
  }
  return hoppers;
}

// Whole-sequence positions of `rank`'s shard: zigzag chunks when causal, else the
// rank-th contiguous piece.
inline std::vector<std::int64_t> shard_positions(int rank, int world, std::int64_t seqlen, bool causal) {
  std::vector<std::int64_t> p;
  if (causal) {
    const std::int64_t chunk = seqlen / (2 * world);
    for (std::int64_t c : {static_cast<std::int64_t>(rank), static_cast<std::int64_t>(2 * world - 1 - rank)}) {
      for (std::int64_t i = 0; i < chunk; ++i) p.push_back(c * chunk + i);
    }
  } else {
    const std::int64_t shard = seqlen / world;
    for (std::int64_t i = 0; i < shard; ++i) p.push_back(rank * shard + i);
  }
  return p;
}

// The rows of (batch, seqlen, heads, dim) host data at `positions`, as (batch, shard, heads, dim);
// `row` is heads * dim.
template <class T>
std::vector<T> take_rows(const std::vector<T>& full, std::int64_t batch, std::int64_t seqlen, std::int64_t row,
                         const std::vector<std::int64_t>& positions) {
  std::vector<T> out;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t p : positions) {
      const auto first = full.begin() + (b * seqlen + p) * row;
      out.insert(out.end(), first, first + row);
    }
  }
  return out;
}

// The inverse: a shard's (batch, shard, heads, dim) rows put at `positions` of `full`.
template <class T>
void put_rows(const std::vector<T>& shard, std::int64_t batch, std::int64_t seqlen, std::int64_t row,
              const std::vector<std::int64_t>& positions, std::vector<T>* full) {
  const auto len = static_cast<std::int64_t>(positions.size());
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < len; ++i) {
      const auto first = shard.begin() + (b * len + i) * row;
      std::copy(first, first + row, full->begin() + (b * seqlen + positions[i]) * row);
    }
  }
}

// The lse values of (batch, heads, seqlen) host data at `positions`, as (batch, heads, shard).
inline std::vector<float> take_lse(const std::vector<float>& full, std::int64_t batch, std::int64_t heads,
                                   std::int64_t seqlen, const std::vector<std::int64_t>& positions) {
  std::vector<float> out;
  for (std::int64_t bh = 0; bh < batch * heads; ++bh) {
    for (std::int64_t p : positions) out.push_back(full[bh * seqlen + p]);
  }
  return out;
}

template <class T>
T* to_device(const std::vector<T>& host) {
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, host.size() * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(ptr);
}

inline std::vector<__nv_bfloat16> random_bf16(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<__nv_bfloat16> x(n);
  for (auto& e : x) e = __float2bfloat16(normal(rng));
  return x;
}

}  // namespace fa3::test
