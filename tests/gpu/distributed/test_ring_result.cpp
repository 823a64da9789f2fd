// The ring's running result (src/distributed/ring_result.h) on one GPU against the same
// merges by fa3::cpu::merge_attention_states: bf16 blocks over the whole shard and over
// either half merged into the fp32 result in place, the first block copied over NaN,
// rows no block saw a key of (0, -inf), NaN in a block's rows of weight 0 and in the
// rows it does not cover, which must stay out; then the result written into a strided
// bf16 out with and without an lse.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "distributed/ring_result.h"
#include "fa3/cpu.h"

namespace fa3::test {
namespace {

using distributed::detail::Half;
using distributed::detail::RunningResult;
using distributed::detail::sequence_part;

constexpr std::int64_t kBatch = 2, kShard = 10, kHeads = 3, kDim = 40;  // kDim: not a multiple of a warp
constexpr std::int64_t kOut = kBatch * kShard * kHeads * kDim, kLse = kBatch * kHeads * kShard;

TensorView out_view(void* data, DType dtype) {
  return TensorView::contiguous(data, dtype, {kBatch, kShard, kHeads, kDim});
}
TensorView lse_view(void* data) { return TensorView::contiguous(data, DType::kFloat32, {kBatch, kHeads, kShard}); }

bool covers(Half half, std::int64_t s) { return half == Half::kWhole || (half == Half::kFirst) == (s < kShard / 2); }

// Row (b, s, h) no block saw a key of: 0 and -inf at the end.
bool dead_everywhere(std::int64_t b, std::int64_t s, std::int64_t h) { return (b * kHeads + h + s) % 7 == 3; }

// One block's buffers over the whole shard as the forward leaves them: values at the
// rows it covers (bf16, so the host keeps them rounded), lse -inf with NaN values where
// it saw no key, NaN at the rows it does not cover.
struct Block {
  Half half;
  std::vector<__nv_bfloat16> out;
  std::vector<float> out_values, lse;
};

Block make_block(Half half, int index, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  Block blk{half, std::vector<__nv_bfloat16>(kOut), std::vector<float>(kOut, NAN), std::vector<float>(kLse, NAN)};
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::int64_t s = 0; s < kShard; ++s)
      for (std::int64_t h = 0; h < kHeads; ++h) {
        if (!covers(half, s)) continue;
        const bool dead = dead_everywhere(b, s, h) || (b + s + h + index) % 5 == 0;
        blk.lse[static_cast<std::size_t>((b * kHeads + h) * kShard + s)] = dead ? -INFINITY : normal(rng);
        if (dead) continue;
        for (std::int64_t d = 0; d < kDim; ++d) {
          const auto at = static_cast<std::size_t>(((b * kShard + s) * kHeads + h) * kDim + d);
          blk.out_values[at] = __bfloat162float(__float2bfloat16(normal(rng)));
        }
      }
  for (std::size_t i = 0; i < blk.out.size(); ++i) blk.out[i] = __float2bfloat16(blk.out_values[i]);
  return blk;
}

template <class T>
void upload(const DeviceBuffer& buf, const std::vector<T>& host) {
  FA3_CUDA_CHECK(cudaMemcpy(buf.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// |gpu - cpu| allowed: fp32 sums in another order, and one more bf16 rounding of the
// written result (half a unit in the last place, 2^-9 of the value).
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& ref, double rounding,
                                 const char* what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == ref[i]) continue;  // also equal infinities
    if (!(std::fabs(static_cast<double>(got[i]) - ref[i]) <= 1e-5 + (1e-5 + rounding) * std::fabs(ref[i]))) {
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << got[i] << ", expected " << ref[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(RingResult, BlocksMergeIntoTheirRowsAndTheResultIsWrittenOut) {
  FA3_REQUIRE_HOPPER();
  DeviceBuffer acc_out(kOut * sizeof(float)), acc_lse(kLse * sizeof(float));
  DeviceBuffer block_out(kOut * sizeof(__nv_bfloat16)), block_lse(kLse * sizeof(float));
  // Before the first block the running result holds garbage: it must not be read.
  fill_nan(acc_out.get(), DType::kFloat32, kOut);
  fill_nan(acc_lse.get(), DType::kFloat32, kLse);
  const RunningResult running{out_view(acc_out.get(), DType::kFloat32), lse_view(acc_lse.get())};
  std::vector<float> host_out(kOut, NAN), host_lse(kLse, NAN);
  const RunningResult host{out_view(host_out.data(), DType::kFloat32), lse_view(host_lse.data())};

  const Half halves[] = {Half::kWhole, Half::kSecond, Half::kFirst, Half::kWhole};
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE("block " + std::to_string(i));
    const Block blk = make_block(halves[i], i, 10 + static_cast<std::uint64_t>(i));
    upload(block_out, blk.out);
    upload(block_lse, blk.lse);
    const TensorView dev_block_out = sequence_part(out_view(block_out.get(), DType::kBFloat16), 1, blk.half);
    const TensorView dev_block_lse = sequence_part(lse_view(block_lse.get()), 2, blk.half);
    const Status st =
        distributed::detail::merge_block(running, dev_block_out, dev_block_lse, blk.half, i == 0, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();

    // The same merge of the same rows on the host.
    MergeArgs ref;
    if (i > 0) {
      ref.outs.push_back(sequence_part(host.out, 1, blk.half));
      ref.lses.push_back(sequence_part(host.lse, 2, blk.half));
    }
    ref.outs.push_back(
        sequence_part(out_view(const_cast<float*>(blk.out_values.data()), DType::kFloat32), 1, blk.half));
    ref.lses.push_back(sequence_part(lse_view(const_cast<float*>(blk.lse.data())), 2, blk.half));
    ref.out = sequence_part(host.out, 1, blk.half);
    ref.lse = sequence_part(host.lse, 2, blk.half);
    ASSERT_TRUE(cpu::merge_attention_states(ref).is_ok());

    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(close(floats_of(acc_out), host_out, 0.0, "running out"));
    EXPECT_TRUE(close(floats_of(acc_lse), host_lse, 0.0, "running lse"));
  }
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::int64_t s = 0; s < kShard; ++s)
      for (std::int64_t h = 0; h < kHeads; ++h) {
        if (!dead_everywhere(b, s, h)) continue;
        EXPECT_EQ(host_lse[static_cast<std::size_t>((b * kHeads + h) * kShard + s)], -INFINITY);
        EXPECT_EQ(host_out[static_cast<std::size_t>(((b * kShard + s) * kHeads + h) * kDim)], 0.f);
      }

  // Into a bf16 out with padded rows and an lse of stride 2 (NaN between values).
  PaddedTensor out = make_tensor(DType::kBFloat16, kBatch, kShard, kHeads, kDim, 20, 8);
  fill_nan(out.buffer.get(), DType::kBFloat16, out.total_elements);
  DeviceBuffer lse_buffer(2 * kLse * sizeof(float));
  fill_nan(lse_buffer.get(), DType::kFloat32, 2 * kLse);
  const TensorView lse = TensorView::strided(lse_buffer.get(), DType::kFloat32, {kBatch, kHeads, kShard},
                                             {2 * kHeads * kShard, 2 * kShard, 2});
  const Status st = distributed::detail::write_result(running, out.view, lse, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(close(dense_host(out.view), host_out, 0x1p-8, "out"));
  EXPECT_TRUE(close(dense_host(lse), host_lse, 0.0, "lse"));
  EXPECT_EQ(written_outside_view(out), 0);

  // Without an lse, out alone is written and the running lse keeps its values.
  const std::vector<float> running_lse = floats_of(acc_lse);
  fill_nan(out.buffer.get(), DType::kBFloat16, out.total_elements);
  const Status no_lse = distributed::detail::write_result(running, out.view, TensorView{}, nullptr);
  ASSERT_TRUE(no_lse.is_ok()) << no_lse.to_string();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(close(dense_host(out.view), host_out, 0x1p-8, "out without lse"));
  const std::vector<float> after = floats_of(acc_lse);
  for (std::size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(after[i] == running_lse[i] || (std::isnan(after[i]) && std::isnan(running_lse[i]))) << i;
  }
}

}  // namespace
}  // namespace fa3::test
