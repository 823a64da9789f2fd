// Ring attention backward over NCCL (fa3/distributed.h) on the GPUs of this machine, one
// thread per rank and device: ring_forward, then ring_backward on its out and lse, as a
// training step runs them. The gradients, put back in sequence order, against the
// reference on the whole sequence with the backward's accuracy rule (one GPU's
// fa3::backward on the whole sequence reported beside them): causal with zigzag shards
// and not, GQA and MQA, every gradient element written (NaN before), the workspace NaN
// at the start, deterministic mode bitwise repeatable. Skipped with fewer Hopper GPUs
// than ranks; a stuck ring fails after a deadline.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <numeric>
#include <vector>

#include "common/gpu_test_util.h"
#include "distributed/ring_shards.h"
#include "distributed/ring_whole.h"
#include "fa3/distributed.h"

namespace fa3::test {
namespace {

constexpr auto kDeadline = std::chrono::seconds(180);

struct RankGradients {
  Status status;
  Gradients grads;          // the shard's dq, dk, dv, dense fp32
  bool repeatable = true;   // deterministic: the second call gave the same bits
};

Status cuda(cudaError_t err) {
  return err == cudaSuccess ? Status::ok() : Status{StatusCode::kCudaError, cudaGetErrorString(err)};
}

// One rank: its shards on its device, ring_forward and ring_backward on streams of its
// own (twice with deterministic), the gradients back.
RankGradients run_rank(int rank, ncclComm_t comm, const RingCase& c, const Whole& w,
                       const std::vector<std::int64_t>& positions) {
  RankGradients r;
  cudaSetDevice(rank);
  const auto len = static_cast<std::int64_t>(positions.size());
  const std::int64_t row_q = c.nheads * c.head_dim, row_kv = c.nheads_kv * c.head_dim;
  DeviceBuffer q = upload(take_rows(w.q, c.batch, c.seqlen, row_q, positions));
  DeviceBuffer k = upload(take_rows(w.k, c.batch, c.seqlen, row_kv, positions));
  DeviceBuffer v = upload(take_rows(w.v, c.batch, c.seqlen, row_kv, positions));
  DeviceBuffer dout = upload(take_rows(w.dout, c.batch, c.seqlen, row_q, positions));
  DeviceBuffer out(c.batch * len * row_q * 2), lse(c.batch * c.nheads * len * 4);
  DeviceBuffer dq(c.batch * len * row_q * 2), dk(c.batch * len * row_kv * 2), dv(c.batch * len * row_kv * 2);
  cudaStream_t compute = nullptr, transfers = nullptr;
  cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&transfers, cudaStreamNonBlocking);

  distributed::RingArgs fwd;
  fwd.q = bf16_rows(q.get(), c.batch, len, c.nheads, c.head_dim);
  fwd.k = bf16_rows(k.get(), c.batch, len, c.nheads_kv, c.head_dim);
  fwd.v = bf16_rows(v.get(), c.batch, len, c.nheads_kv, c.head_dim);
  fwd.out = bf16_rows(out.get(), c.batch, len, c.nheads, c.head_dim);
  fwd.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {c.batch, c.nheads, len});
  fwd.causal = c.causal;
  fwd.comm_stream = transfers;
  std::size_t bytes = 0;
  r.status = distributed::ring_workspace_size(fwd, c.world, &bytes);
  DeviceBuffer fwd_ws(std::max<std::size_t>(bytes, 256));
  fwd.workspace = fwd_ws.get();
  fwd.workspace_bytes = bytes;
  if (r.status.is_ok()) r.status = distributed::ring_forward(fwd, comm, compute);

  distributed::RingBackwardArgs bwd;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.out = fwd.out;
  bwd.lse = fwd.lse;
  bwd.dout = bf16_rows(dout.get(), c.batch, len, c.nheads, c.head_dim);
  bwd.dq = bf16_rows(dq.get(), c.batch, len, c.nheads, c.head_dim);
  bwd.dk = bf16_rows(dk.get(), c.batch, len, c.nheads_kv, c.head_dim);
  bwd.dv = bf16_rows(dv.get(), c.batch, len, c.nheads_kv, c.head_dim);
  bwd.causal = c.causal;
  bwd.deterministic = c.deterministic;
  bwd.comm_stream = transfers;
  if (r.status.is_ok()) r.status = distributed::ring_backward_workspace_size(bwd, c.world, &bytes);
  DeviceBuffer bwd_ws(r.status.is_ok() ? bytes : 256);
  fill_nan(bwd_ws.get(), DType::kFloat32, static_cast<std::int64_t>(bwd_ws.bytes() / 4));
  bwd.workspace = bwd_ws.get();
  bwd.workspace_bytes = bytes;
  for (int run = 0; r.status.is_ok() && run < (c.deterministic ? 2 : 1); ++run) {
    for (const TensorView* g : {&bwd.dq, &bwd.dk, &bwd.dv}) fill_nan(g->data, DType::kBFloat16, g->numel());
    // The fills run on the default stream, which the compute stream does not wait for.
    r.status = cuda(cudaDeviceSynchronize());
    if (r.status.is_ok()) r.status = distributed::ring_backward(bwd, comm, compute);
    if (r.status.is_ok()) r.status = cuda(cudaStreamSynchronize(compute));
    if (!r.status.is_ok()) break;
    const Gradients grads = {dense_host(bwd.dq), dense_host(bwd.dk), dense_host(bwd.dv)};
    if (run == 0) {
      r.grads = grads;
    } else {
      for (int g = 0; g < kGradients; ++g) {
        r.repeatable = r.repeatable && std::memcmp(grads[g].data(), r.grads[g].data(), grads[g].size() * 4) == 0;
      }
    }
  }
  cudaStreamDestroy(compute);
  cudaStreamDestroy(transfers);
  return r;
}

void check_ring_backward(const RingCase& c) {
  if (hopper_devices() < c.world) GTEST_SKIP() << "needs " << c.world << " Hopper GPUs";
  cudaSetDevice(0);
  Whole w;
  make_whole(c, &w);
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  const BackwardReport one_gpu = one_gpu_backward(w);

  std::vector<ncclComm_t> comms(c.world);
  std::vector<int> devices(c.world);
  std::iota(devices.begin(), devices.end(), 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), c.world, devices.data()), ncclSuccess);
  std::vector<std::future<RankGradients>> ranks;
  for (int r = 0; r < c.world; ++r) {
    ranks.push_back(std::async(std::launch::async, run_rank, r, comms[r], std::cref(c), std::cref(w),
                               shard_positions(r, c.world, c.seqlen, c.causal)));
  }
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  for (auto& f : ranks) {
    if (f.wait_until(deadline) != std::future_status::ready) {
      for (ncclComm_t comm : comms) ncclCommAbort(comm);
      FAIL() << "the ring of " << c.world << " ranks did not finish within " << kDeadline.count() << " s";
    }
  }
  // The ring's gradients, put back in sequence order.
  const std::array<const TensorView*, kGradients> whole = gradient_views(w.args);
  Gradients grads;
  for (int g = 0; g < kGradients; ++g) grads[g].assign(static_cast<std::size_t>(whole[g]->numel()), NAN);
  for (int r = 0; r < c.world; ++r) {
    const RankGradients result = ranks[r].get();
    ASSERT_TRUE(result.status.is_ok()) << "rank " << r << ": " << result.status.to_string();
    EXPECT_TRUE(result.repeatable) << "rank " << r << ": deterministic calls differ";
    const auto positions = shard_positions(r, c.world, c.seqlen, c.causal);
    for (int g = 0; g < kGradients; ++g) {
      put_rows(result.grads[g], c.batch, c.seqlen, whole[g]->shape[2] * whole[g]->shape[3], positions, &grads[g]);
    }
  }
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
  cudaSetDevice(0);
  EXPECT_TRUE(backward_accurate(compare_gradients(w, grads), DType::kBFloat16))
      << "world " << c.world << (c.causal ? " causal" : "") << "; one GPU's fa3::backward: " << one_gpu.summary();
}

int all_hoppers() { return std::max(2, hopper_devices()); }

TEST(RingBackward, TwoRanks) { check_ring_backward({2, 2, 2 * 300, 8, 2, 128, false}); }

TEST(RingBackward, TwoRanksCausalZigzag) { check_ring_backward({2, 2, 4 * 113, 8, 2, 128, true}); }

TEST(RingBackward, EveryGpuCausalZigzagMqa) {
  const int world = all_hoppers();
  check_ring_backward({world, 1, 2 * world * 129, 8, 1, 128, true});
}

TEST(RingBackward, EveryGpuHeadDim64) {
  const int world = all_hoppers();
  check_ring_backward({world, 1, world * 1000, 4, 4, 64, false});
}

TEST(RingBackward, DeterministicIsBitwiseRepeatable) { check_ring_backward({2, 1, 4 * 256, 8, 2, 128, true, true}); }

TEST(RingBackward, OneRankIsTheLocalBackward) { check_ring_backward({1, 2, 500, 8, 2, 128, true}); }

}  // namespace
}  // namespace fa3::test
