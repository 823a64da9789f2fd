// The ring's device merges (src/distributed/ring_merge.h) on one GPU against the host
// merge they mirror (reference::merge_row): blocks over the whole shard and over either
// half, the first block of a ring, rows no part saw a key of (-inf), and NaN in a part
// of weight 0 or in rows a block does not cover, which must stay out; then the
// finalize into a strided output.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "distributed/ring_merge.h"
#include "reference/lse_merge.h"

namespace fa3::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::int64_t kBatch = 2, kShard = 10, kHeads = 3, kDim = 40;  // kDim: not a multiple of a warp
constexpr std::int64_t kOut = kBatch * kShard * kHeads * kDim, kLse = kBatch * kHeads * kShard;

std::int64_t out_at(std::int64_t b, std::int64_t s, std::int64_t h) { return ((b * kShard + s) * kHeads + h) * kDim; }
std::int64_t lse_at(std::int64_t b, std::int64_t s, std::int64_t h) { return (b * kHeads + h) * kShard + s; }

template <class T>
void upload(DeviceBuffer& buf, const std::vector<T>& host) {
  ASSERT_EQ(cudaMemcpy(buf.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

struct Case {
  std::int64_t row0, rows;
  bool first;
};

TEST(RingMergeKernel, MatchesTheHostMerge) {
  FA3_REQUIRE_HOPPER();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (const Case c : {Case{0, kShard, true}, Case{0, kShard, false}, Case{0, kShard / 2, false},
                       Case{kShard / 2, kShard / 2, false}}) {
    std::vector<float> acc(kOut), acc_lse(kLse), block_lse(kLse, std::nanf(""));
    std::vector<__nv_bfloat16> block(kOut, __float2bfloat16(std::nanf("")));
    for (auto& x : acc) x = normal(rng);
    for (auto& x : acc_lse) x = 3.f * normal(rng);
    for (std::int64_t b = 0; b < kBatch; ++b) {
      for (std::int64_t s = c.row0; s < c.row0 + c.rows; ++s) {
        for (std::int64_t h = 0; h < kHeads; ++h) {
          for (std::int64_t d = 0; d < kDim; ++d) block[out_at(b, s, h) + d] = __float2bfloat16(normal(rng));
          block_lse[lse_at(b, s, h)] = 3.f * normal(rng);
        }
      }
    }
    // Rows no key reached: in the block only, in the running result only, in both.
    block_lse[lse_at(0, c.row0, 0)] = -kInf;
    acc_lse[lse_at(0, c.row0, 1)] = -kInf;
    acc[out_at(0, c.row0, 1)] = std::nanf("");  // weight 0: never read
    block_lse[lse_at(1, c.row0, 2)] = -kInf;
    acc_lse[lse_at(1, c.row0, 2)] = -kInf;

    DeviceBuffer d_acc(kOut * 4), d_acc_lse(kLse * 4), d_block(kOut * 2), d_block_lse(kLse * 4);
    upload(d_acc, acc);
    upload(d_acc_lse, acc_lse);
    upload(d_block, block);
    upload(d_block_lse, block_lse);
    distributed::detail::RingMergeArgs args{static_cast<float*>(d_acc.get()), static_cast<float*>(d_acc_lse.get()),
                                            d_block.get(), static_cast<const float*>(d_block_lse.get()),
                                            DType::kBFloat16, kBatch, kShard, kHeads, kDim, c.row0, c.rows, c.first};
    ASSERT_EQ(distributed::detail::launch_ring_merge(args, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = floats_of(d_acc), got_lse = floats_of(d_acc_lse);

    for (std::int64_t b = 0; b < kBatch; ++b) {
      for (std::int64_t s = 0; s < kShard; ++s) {
        for (std::int64_t h = 0; h < kHeads; ++h) {
          const std::int64_t o = out_at(b, s, h), l = lse_at(b, s, h);
          std::vector<float> want(kDim);
          float want_lse = acc_lse[l];
          if (s < c.row0 || s >= c.row0 + c.rows) {  // not the block's rows: untouched
            want.assign(acc.begin() + o, acc.begin() + o + kDim);
          } else {
            const float lses[2] = {c.first ? -kInf : acc_lse[l], block_lse[l]};
            want_lse = reference::merge_row(
                2, kDim, [&](std::int64_t i) { return lses[i]; },
                [&](std::int64_t i, std::int64_t d) {
                  return i == 0 ? acc[o + d] : __bfloat162float(block[o + d]);
                },
                want.data());
          }
          ASSERT_EQ(std::isinf(got_lse[l]), std::isinf(want_lse)) << b << " " << s << " " << h;
          if (!std::isinf(want_lse)) EXPECT_NEAR(got_lse[l], want_lse, 1e-5f * (1.f + std::fabs(want_lse)));
          for (std::int64_t d = 0; d < kDim; ++d) {
            EXPECT_NEAR(got[o + d], want[d], 1e-5f * (1.f + std::fabs(want[d])))
                << "row0 " << c.row0 << " first " << c.first << " at " << b << " " << s << " " << h << " " << d;
          }
        }
      }
    }
  }
}

TEST(RingFinalizeKernel, WritesTheStridedOutputAndLse) {
  FA3_REQUIRE_HOPPER();
  std::vector<float> acc(kOut), acc_lse(kLse);
  for (std::int64_t i = 0; i < kOut; ++i) acc[i] = 0.001f * static_cast<float>(i % 977) - 0.4f;
  for (std::int64_t i = 0; i < kLse; ++i) acc_lse[i] = 0.5f * static_cast<float>(i);
  DeviceBuffer d_acc(kOut * 4), d_acc_lse(kLse * 4);
  upload(d_acc, acc);
  upload(d_acc_lse, acc_lse);
  // out with 8 elements of padding after each row of the last dim, lse (batch, heads, shard + 2).
  const std::int64_t row = kDim + 8, lse_row = kShard + 2;
  DeviceBuffer d_out(kBatch * kShard * kHeads * row * 2), d_lse(kBatch * kHeads * lse_row * 4);
  fill_nan(d_out.get(), DType::kBFloat16, kBatch * kShard * kHeads * row);
  fill_nan(d_lse.get(), DType::kFloat32, kBatch * kHeads * lse_row);
  distributed::detail::RingFinalizeArgs args{};
  args.acc_out = static_cast<const float*>(d_acc.get());
  args.acc_lse = static_cast<const float*>(d_acc_lse.get());
  args.out = TensorView::strided(d_out.get(), DType::kBFloat16, {kBatch, kShard, kHeads, kDim},
                                 {kShard * kHeads * row, kHeads * row, row, 1});
  args.lse = TensorView::strided(d_lse.get(), DType::kFloat32, {kBatch, kHeads, kShard},
                                 {kHeads * lse_row, lse_row, 1});
  ASSERT_EQ(distributed::detail::launch_ring_finalize(args, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> out = dense_host(args.out), lse = dense_host(args.lse);
  for (std::int64_t i = 0; i < kOut; ++i) {
    ASSERT_EQ(out[i], __bfloat162float(__float2bfloat16(acc[i]))) << i;
  }
  for (std::int64_t i = 0; i < kLse; ++i) ASSERT_EQ(lse[i], acc_lse[i]) << i;
  // The padding stays NaN.
  const std::vector<float> all_lse = floats_of(d_lse);
  for (std::int64_t r = 0; r < kBatch * kHeads; ++r) {
    EXPECT_TRUE(std::isnan(all_lse[r * lse_row + kShard]) && std::isnan(all_lse[r * lse_row + kShard + 1]));
  }
}

}  // namespace
}  // namespace fa3::test
