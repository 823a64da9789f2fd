// The ring backward's math apart from NCCL, on one GPU. The gradient sums
// (src/distributed/grad_sum.h) against the same fp32 sums on the host, bit for bit,
// through contiguous and strided views (16-byte accesses and element by element), the
// first sum written over NaN. Then the ring's steps (src/distributed/ring_grads.h) over
// simulated ranks: each rank's shard in buffers of its own, each step's block backward
// and sums as ring_backward enqueues them, the hops of the dk/dv sums done by copies
// between the ranks' workspaces; the gradients, put back in sequence order, against the
// reference on the whole sequence with the backward's accuracy rule, every element of
// strided gradients written and nothing around them, workspaces full of NaN at the
// start, and deterministic mode bitwise repeatable.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "distributed/grad_sum.h"
#include "distributed/ring_grads.h"
#include "distributed/ring_shards.h"
#include "distributed/ring_whole.h"
#include "fa3/distributed.h"

namespace fa3::test {
namespace {

using distributed::detail::BackwardLayout;
using distributed::detail::BackwardStep;
using distributed::detail::GradientSums;

TEST(RingGradSum, CopiesAddsAndWritesThroughAnyStrides) {
  FA3_REQUIRE_HOPPER();
  constexpr std::int64_t kB = 2, kS = 10, kH = 3, kD = 40, kN = kB * kS * kH * kD;
  // Contiguous, then rows padded by 3 (element by element), then by 8 (16-byte accesses).
  const PaddedTensor grads[3] = {make_tensor(DType::kBFloat16, kB, kS, kH, kD, 1),
                                 make_tensor(DType::kBFloat16, kB, kS, kH, kD, 2, 3),
                                 make_tensor(DType::kBFloat16, kB, kS, kH, kD, 3, 8)};
  DeviceBuffer sum(kN * sizeof(float));
  fill_nan(sum.get(), DType::kFloat32, kN);  // the first gradient is copied: NaN must not come through
  const TensorView sum_view = TensorView::contiguous(sum.get(), DType::kFloat32, {kB, kS, kH, kD});
  std::vector<float> expected(kN, 0.f);
  for (int i = 0; i < 3; ++i) {
    const Status st = distributed::detail::add_gradient(sum_view, grads[i].view, i == 0, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const std::vector<float> g = dense_host(grads[i].view);
    for (std::int64_t e = 0; e < kN; ++e) expected[e] = i == 0 ? g[e] : expected[e] + g[e];
  }
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = floats_of(sum);
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), kN * sizeof(float)), 0) << "the same fp32 sums, in order";

  // Out into bf16 rows padded by 3 with a row between batches and a margin, and into a
  // contiguous fp16: rounded to nearest, nothing written around the view.
  PaddedTensor bf16 = make_tensor(DType::kBFloat16, kB, kS, kH, kD, 4, 3, 1, 16);
  PaddedTensor fp16 = make_tensor(DType::kFloat16, kB, kS, kH, kD, 5, 0, 0, 16);
  for (PaddedTensor* t : {&bf16, &fp16}) {
    fill_nan(t->buffer.get(), t->view.dtype, t->total_elements);
    const Status st = distributed::detail::write_gradient(sum_view, t->view, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got_bf16 = dense_host(bf16.view), got_fp16 = dense_host(fp16.view);
  for (std::int64_t e = 0; e < kN; ++e) {
    ASSERT_EQ(got_bf16[e], __bfloat162float(__float2bfloat16(expected[e]))) << "bf16 element " << e;
    ASSERT_EQ(got_fp16[e], __half2float(__float2half(expected[e]))) << "fp16 element " << e;
  }
  EXPECT_EQ(written_outside_view(bf16), 0);
  EXPECT_EQ(written_outside_view(fp16), 0);
}

// One simulated rank: its shards, its gradients (rows padded by 8 elements, NaN around
// them), its workspace and its plan.
struct Rank {
  std::vector<std::int64_t> positions;
  DeviceBuffer q, k, v, out, dout, lse, workspace;
  PaddedTensor dq, dk, dv;
  distributed::RingBackwardArgs args;
  BackwardLayout layout;
  GradientSums sums;
  std::vector<BackwardStep> steps;
};

void make_rank(const RingCase& c, const Whole& w, int r, Rank* rank) {
  rank->positions = shard_positions(r, c.world, c.seqlen, c.causal);
  const auto& pos = rank->positions;
  const auto len = static_cast<std::int64_t>(pos.size());
  const std::int64_t row_q = c.nheads * c.head_dim, row_kv = c.nheads_kv * c.head_dim;
  rank->q = upload(take_rows(w.q, c.batch, c.seqlen, row_q, pos));
  rank->k = upload(take_rows(w.k, c.batch, c.seqlen, row_kv, pos));
  rank->v = upload(take_rows(w.v, c.batch, c.seqlen, row_kv, pos));
  rank->out = upload(take_rows(w.out, c.batch, c.seqlen, row_q, pos));
  rank->dout = upload(take_rows(w.dout, c.batch, c.seqlen, row_q, pos));
  rank->lse = upload(take_lse(w.lse, c.batch, c.nheads, c.seqlen, pos));
  rank->dq = make_tensor(DType::kBFloat16, c.batch, len, c.nheads, c.head_dim, 0, 8, 0, 64);
  rank->dk = make_tensor(DType::kBFloat16, c.batch, len, c.nheads_kv, c.head_dim, 0, 8, 0, 64);
  rank->dv = make_tensor(DType::kBFloat16, c.batch, len, c.nheads_kv, c.head_dim, 0, 8, 0, 64);
  for (PaddedTensor* t : {&rank->dq, &rank->dk, &rank->dv}) fill_nan(t->buffer.get(), t->view.dtype, t->total_elements);
  distributed::RingBackwardArgs& a = rank->args;
  a.q = bf16_rows(rank->q.get(), c.batch, len, c.nheads, c.head_dim);
  a.k = bf16_rows(rank->k.get(), c.batch, len, c.nheads_kv, c.head_dim);
  a.v = bf16_rows(rank->v.get(), c.batch, len, c.nheads_kv, c.head_dim);
  a.out = bf16_rows(rank->out.get(), c.batch, len, c.nheads, c.head_dim);
  a.dout = bf16_rows(rank->dout.get(), c.batch, len, c.nheads, c.head_dim);
  a.lse = TensorView::contiguous(rank->lse.get(), DType::kFloat32, {c.batch, c.nheads, len});
  a.dq = rank->dq.view;
  a.dk = rank->dk.view;
  a.dv = rank->dv.view;
  a.causal = c.causal;
  a.deterministic = c.deterministic;
  std::size_t bytes = 0;
  Status st = distributed::ring_backward_workspace_size(a, c.world, &bytes);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  rank->workspace = DeviceBuffer(bytes);
  fill_nan(rank->workspace.get(), DType::kFloat32, static_cast<std::int64_t>(bytes / 4));
  a.workspace = rank->workspace.get();
  a.workspace_bytes = bytes;
  st = distributed::detail::validate_ring_backward(a, r, c.world, gpu_backward_target(), true, &rank->layout);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  rank->sums = distributed::detail::gradient_sums(a, rank->layout);
  rank->steps = distributed::detail::ring_backward_schedule(r, c.world, c.causal);
}

// The ring's steps on every simulated rank, as ring_backward enqueues them on each, with
// the hops of the sums as copies; then the gradients written. The K/V shard a step holds
// is its source's own: the hops move shards whole, bit for bit.
void run_steps(const RingCase& c, std::vector<Rank>& ranks) {
  namespace d = distributed::detail;
  for (int s = 0; s < c.world; ++s) {
    for (Rank& rank : ranks) {
      const BackwardStep& step = rank.steps[s];
      const Rank& source = ranks[step.ring.source];
      const d::KvShard kv{source.args.k, source.args.v};
      const bool first = s == 0;
      Status st = d::block_backward(rank.args, rank.sums, step.ring.block, kv, nullptr);
      ASSERT_TRUE(st.is_ok()) << "step " << s << ": " << st.to_string();
      st = d::add_block_dq(rank.sums, step.ring.block, first, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      st = d::add_block_dkv(rank.sums, step.ring.block, step.grads_hand, first, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
    for (int r = 0; r < c.world; ++r) {
      const Rank& from = ranks[r];
      Rank& to = ranks[(r + 1) % c.world];
      const int send = from.steps[s].grads_hand, receive = to.steps[s].grads_receive;
      FA3_CUDA_CHECK(cudaMemcpy(to.sums.dk[receive].data, from.sums.dk[send].data, from.layout.dk_sum_bytes,
                                cudaMemcpyDeviceToDevice));
      FA3_CUDA_CHECK(cudaMemcpy(to.sums.dv[receive].data, from.sums.dv[send].data, from.layout.dv_sum_bytes,
                                cudaMemcpyDeviceToDevice));
    }
  }
  for (Rank& rank : ranks) {
    Status st = d::write_dq(rank.sums, rank.args.dq, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    st = d::write_dkv(rank.sums, d::grads_home(c.world), rank.args.dk, rank.args.dv, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
}

// The simulated ring's dq, dk and dv in sequence order (fp32 of their bf16 values).
void simulate(const RingCase& c, const Whole& w, Gradients* grads) {
  std::vector<Rank> ranks(c.world);
  for (int r = 0; r < c.world; ++r) {
    make_rank(c, w, r, &ranks[r]);
    if (::testing::Test::HasFatalFailure()) return;
  }
  run_steps(c, ranks);
  if (::testing::Test::HasFatalFailure()) return;
  const std::array<const TensorView*, kGradients> whole = gradient_views(w.args);
  for (int g = 0; g < kGradients; ++g) {
    const std::int64_t row = whole[g]->shape[2] * whole[g]->shape[3];
    (*grads)[g].assign(static_cast<std::size_t>(whole[g]->numel()), NAN);
    for (Rank& rank : ranks) {
      const PaddedTensor* t[kGradients] = {&rank.dq, &rank.dk, &rank.dv};
      put_rows(dense_host(t[g]->view), c.batch, c.seqlen, row, rank.positions, &(*grads)[g]);
      EXPECT_EQ(written_outside_view(*t[g]), 0) << kGradientNames[g];
    }
  }
}

void check_ring_steps(const RingCase& c) {
  FA3_REQUIRE_HOPPER();
  Whole w;
  make_whole(c, &w);
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  Gradients grads;
  simulate(c, w, &grads);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_TRUE(backward_accurate(compare_gradients(w, grads), DType::kBFloat16)) << c.world << " simulated ranks";
  if (c.deterministic) {
    Gradients again;
    simulate(c, w, &again);
    for (int g = 0; g < kGradients; ++g) {
      EXPECT_EQ(std::memcmp(grads[g].data(), again[g].data(), grads[g].size() * sizeof(float)), 0)
          << kGradientNames[g] << " differs between two deterministic runs";
    }
  }
}

TEST(RingBackwardSteps, TwoRanksNoMask) { check_ring_steps({2, 1, 2 * 301, 4, 4, 128, false}); }

TEST(RingBackwardSteps, ThreeRanksCausalZigzagGqa) { check_ring_steps({3, 2, 6 * 113, 8, 2, 128, true}); }

TEST(RingBackwardSteps, FourRanksCausalZigzagMqaHeadDim64) { check_ring_steps({4, 1, 8 * 129, 8, 1, 64, true}); }

TEST(RingBackwardSteps, DeterministicIsBitwiseRepeatable) { check_ring_steps({2, 2, 4 * 200, 8, 2, 128, true, true}); }

}  // namespace
}  // namespace fa3::test
