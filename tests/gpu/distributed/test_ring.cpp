// Ring attention over NCCL (fa3/distributed.h) on the GPUs of this machine, one thread
// per rank and device, against the CUDA reference on the whole sequence with the
// forward's accuracy rule: causal with zigzag shards and not, GQA, a chunk length that
// is not a multiple of a tile, every output element written. Skipped with fewer than two
// Hopper GPUs (one for the one-rank fallback); a stuck ring fails after a deadline.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "api/validate.h"
#include "common/gpu_test_util.h"
#include "distributed/ring_shards.h"
#include "fa3/distributed.h"
#include "reference/cuda_reference.h"

namespace fa3::test {
namespace {

constexpr auto kDeadline = std::chrono::seconds(120);

struct RingProblem {
  std::int64_t batch, seqlen, nheads, nheads_kv, head_dim;
};

struct RankResult {
  Status status;
  std::vector<__nv_bfloat16> out;
  std::vector<float> lse;  // (batch, nheads, shard)
};

// One rank: its shard on its device, ring_forward on streams of its own, results back.
RankResult run_rank(int rank, ncclComm_t comm, const RingProblem& p, bool causal, const std::vector<__nv_bfloat16>& q,
                    const std::vector<__nv_bfloat16>& k, const std::vector<__nv_bfloat16>& v,
                    const std::vector<std::int64_t>& positions) {
  RankResult r;
  cudaSetDevice(rank);
  const std::int64_t shard = static_cast<std::int64_t>(positions.size());
  auto* dq = to_device(take_rows(q, p.batch, p.seqlen, p.nheads * p.head_dim, positions));
  auto* dk = to_device(take_rows(k, p.batch, p.seqlen, p.nheads_kv * p.head_dim, positions));
  auto* dv = to_device(take_rows(v, p.batch, p.seqlen, p.nheads_kv * p.head_dim, positions));
  const std::int64_t out_elems = p.batch * shard * p.nheads * p.head_dim, lse_elems = p.batch * p.nheads * shard;
  void *dout = nullptr, *dlse = nullptr, *ws = nullptr;
  cudaMalloc(&dout, out_elems * 2);
  cudaMalloc(&dlse, lse_elems * 4);
  fill_nan(dout, DType::kBFloat16, out_elems);  // every element must be written
  fill_nan(dlse, DType::kFloat32, lse_elems);
  // The fills run on the default stream, which the ring's non-blocking streams do not wait for.
  cudaDeviceSynchronize();

  distributed::RingArgs args;
  args.q = TensorView::contiguous(dq, DType::kBFloat16, {p.batch, shard, p.nheads, p.head_dim});
  args.k = TensorView::contiguous(dk, DType::kBFloat16, {p.batch, shard, p.nheads_kv, p.head_dim});
  args.v = TensorView::contiguous(dv, DType::kBFloat16, {p.batch, shard, p.nheads_kv, p.head_dim});
  args.out = TensorView::contiguous(dout, DType::kBFloat16, {p.batch, shard, p.nheads, p.head_dim});
  args.lse = TensorView::contiguous(dlse, DType::kFloat32, {p.batch, p.nheads, shard});
  args.causal = causal;
  int world = 0;
  ncclCommCount(comm, &world);
  std::size_t bytes = 0;
  r.status = distributed::ring_workspace_size(args, world, &bytes);
  if (!r.status.is_ok()) return r;
  cudaMalloc(&ws, bytes == 0 ? 256 : bytes);
  args.workspace = ws;
  args.workspace_bytes = bytes;
  cudaStream_t compute = nullptr, transfers = nullptr;
  cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&transfers, cudaStreamNonBlocking);
  args.comm_stream = transfers;
  r.status = distributed::ring_forward(args, comm, compute);
  if (r.status.is_ok()) {
    const cudaError_t err = cudaStreamSynchronize(compute);
    if (err != cudaSuccess) r.status = {StatusCode::kCudaError, cudaGetErrorString(err)};
  }
  r.out.resize(out_elems);
  r.lse.resize(lse_elems);
  cudaMemcpy(r.out.data(), dout, out_elems * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(r.lse.data(), dlse, lse_elems * 4, cudaMemcpyDeviceToHost);
  for (void* ptr : {static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv), dout, dlse, ws}) {
    cudaFree(ptr);
  }
  cudaStreamDestroy(compute);
  cudaStreamDestroy(transfers);
  return r;
}

// The fp32 reference (exact and like-inputs) of the whole problem on device 0.
struct Reference {
  std::vector<float> out, lse, low_out, low_lse;
};
Reference reference_of(const RingProblem& p, bool causal, const std::vector<__nv_bfloat16>& q,
                       const std::vector<__nv_bfloat16>& k, const std::vector<__nv_bfloat16>& v) {
  cudaSetDevice(0);
  ForwardArgs args;
  args.q = TensorView::contiguous(to_device(q), DType::kBFloat16, {p.batch, p.seqlen, p.nheads, p.head_dim});
  args.k = TensorView::contiguous(to_device(k), DType::kBFloat16, {p.batch, p.seqlen, p.nheads_kv, p.head_dim});
  args.v = TensorView::contiguous(to_device(v), DType::kBFloat16, {p.batch, p.seqlen, p.nheads_kv, p.head_dim});
  args.out = args.q;  // validation only: the reference writes its own fp32 buffers
  args.options.causal = causal;
  Problem problem;
  EXPECT_TRUE(validate_forward(args, gpu_target(), &problem).is_ok());
  const std::int64_t n_out = p.batch * p.seqlen * p.nheads * p.head_dim, n_lse = p.batch * p.nheads * p.seqlen;
  DeviceBuffer out(n_out * 4), lse(n_lse * 4), low_out(n_out * 4), low_lse(n_lse * 4);
  for (auto [o, l, precision] : {std::tuple{&out, &lse, reference::Precision::kExact},
                                 std::tuple{&low_out, &low_lse, reference::Precision::kLikeInputs}}) {
    EXPECT_TRUE(reference::cuda_forward(problem, args.q, args.k, args.v, nullptr, static_cast<float*>(o->get()),
                                        static_cast<float*>(l->get()), precision, nullptr)
                    .is_ok());
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const TensorView* t : {&args.q, &args.k, &args.v}) cudaFree(t->data);
  return {floats_of(out), floats_of(lse), floats_of(low_out), floats_of(low_lse)};
}

void check_ring(int world, const RingProblem& p, bool causal) {
  if (hopper_devices() < world) GTEST_SKIP() << "needs " << world << " Hopper GPUs";
  {  // The build may lack this head dim's kernels (FA3_HEAD_DIMS): the size query says so.
    cudaSetDevice(0);
    void* fake = reinterpret_cast<void*>(0x100000);
    distributed::RingArgs shape;
    shape.q = TensorView::contiguous(fake, DType::kBFloat16, {p.batch, p.seqlen / world, p.nheads, p.head_dim});
    shape.k = TensorView::contiguous(fake, DType::kBFloat16, {p.batch, p.seqlen / world, p.nheads_kv, p.head_dim});
    shape.v = shape.k;
    shape.out = shape.q;
    std::size_t bytes = 0;
    const Status built = distributed::ring_workspace_size(shape, world, &bytes);
    if (built.code() == StatusCode::kNotSupported) GTEST_SKIP() << built.to_string();
    ASSERT_TRUE(built.is_ok()) << built.to_string();
  }
  const auto q = random_bf16(p.batch * p.seqlen * p.nheads * p.head_dim, 1);
  const auto k = random_bf16(p.batch * p.seqlen * p.nheads_kv * p.head_dim, 2);
  const auto v = random_bf16(p.batch * p.seqlen * p.nheads_kv * p.head_dim, 3);
  const Reference ref = reference_of(p, causal, q, k, v);

  std::vector<ncclComm_t> comms(world);
  std::vector<int> devices(world);
  std::iota(devices.begin(), devices.end(), 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), world, devices.data()), ncclSuccess);
  std::vector<std::future<RankResult>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::async(std::launch::async, run_rank, r, comms[r], p, causal, std::cref(q), std::cref(k),
                               std::cref(v), shard_positions(r, world, p.seqlen, causal)));
  }
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  for (auto& f : ranks) {
    if (f.wait_until(deadline) != std::future_status::ready) {
      for (ncclComm_t c : comms) ncclCommAbort(c);
      FAIL() << "the ring of " << world << " ranks did not finish within " << kDeadline.count() << " s";
    }
  }
  // The ring's results, put back in sequence order.
  std::vector<float> out(ref.out.size()), lse(ref.lse.size());
  for (int r = 0; r < world; ++r) {
    RankResult result = ranks[r].get();
    ASSERT_TRUE(result.status.is_ok()) << "rank " << r << ": " << result.status.to_string();
    const auto positions = shard_positions(r, world, p.seqlen, causal);
    const std::int64_t shard = static_cast<std::int64_t>(positions.size()), row = p.nheads * p.head_dim;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t i = 0; i < shard; ++i) {
        for (std::int64_t e = 0; e < row; ++e) {
          out[(b * p.seqlen + positions[i]) * row + e] = __bfloat162float(result.out[(b * shard + i) * row + e]);
        }
        for (std::int64_t h = 0; h < p.nheads; ++h) {
          lse[(b * p.nheads + h) * p.seqlen + positions[i]] = result.lse[(b * p.nheads + h) * shard + i];
        }
      }
    }
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  AccuracyReport report;
  report.out_err = max_abs_diff(out, ref.out);
  report.out_low_err = max_abs_diff(ref.low_out, ref.out);
  report.lse_err = max_abs_diff(lse, ref.lse);
  report.lse_low_err = max_abs_diff(ref.low_lse, ref.lse);
  EXPECT_TRUE(forward_accurate(report, DType::kBFloat16)) << "world " << world << (causal ? " causal" : "");
}

int all_hoppers() { return std::max(2, hopper_devices()); }

TEST(RingForward, TwoRanks) {
  check_ring(2, {2, 2 * 300, 8, 2, 128}, false);
}

TEST(RingForward, TwoRanksCausalZigzag) {
  check_ring(2, {2, 4 * 113, 8, 2, 128}, true);
}

TEST(RingForward, EveryGpuCausalZigzag) {
  const int world = all_hoppers();
  check_ring(world, {1, 2 * world * 129, 8, 1, 128}, true);
}

TEST(RingForward, EveryGpuHeadDim64) {
  const int world = all_hoppers();
  check_ring(world, {1, world * 1000, 4, 4, 64}, false);
}

TEST(RingForward, OneRankIsTheLocalKernel) {
  check_ring(1, {2, 500, 8, 2, 128}, true);
}

}  // namespace
}  // namespace fa3::test
