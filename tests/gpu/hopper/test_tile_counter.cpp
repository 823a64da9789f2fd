// The dynamic scheduler's tile counters (hopper/tile_counter.h): one kept per stream,
// zero before every launch because each causal launch leaves it at zero, one of its own
// for a launch captured into a graph, and a counter per launch once the table of kept
// ones is full.
// Its own executable: the last test fills the process-wide table.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/fa3.h"
#include "hopper/fwd_dispatch.h"
#include "hopper/tile_counter.h"
#include "hopper/varlen_batch.h"

namespace fa3::test {
namespace {

using hopper::acquire_tile_counter;
using hopper::release_tile_counter;
using hopper::TileCounter;

class Stream {
 public:
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

int read_counter(const TileCounter& c, cudaStream_t stream) {
  int value = -1;
  EXPECT_EQ(cudaMemcpyAsync(&value, c.ptr, sizeof(int), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return value;
}

TEST(TileCounter, KeptPerStreamAndZero) {
  FA3_REQUIRE_HOPPER();
  Stream a, b;
  TileCounter a1, a2, b1;
  ASSERT_TRUE(acquire_tile_counter(a.get(), &a1).is_ok());
  ASSERT_TRUE(acquire_tile_counter(a.get(), &a2).is_ok());
  ASSERT_TRUE(acquire_tile_counter(b.get(), &b1).is_ok());
  ASSERT_NE(a1.ptr, nullptr);
  ASSERT_NE(b1.ptr, nullptr);
  EXPECT_FALSE(a1.per_launch);
  EXPECT_EQ(a1.ptr, a2.ptr);
  EXPECT_NE(a1.ptr, b1.ptr);
  EXPECT_EQ(read_counter(a1, a.get()), 0);
  EXPECT_EQ(read_counter(b1, b.get()), 0);
  EXPECT_TRUE(release_tile_counter(a1, a.get()).is_ok());
  // Releasing a kept counter leaves it to the stream.
  TileCounter a3;
  ASSERT_TRUE(acquire_tile_counter(a.get(), &a3).is_ok());
  EXPECT_EQ(a3.ptr, a1.ptr);
}

// Under capture (global mode, as inference engines capture) a launch gets a counter of
// its own, made, zeroed and freed by nodes of the graph; the graph replays.
TEST(TileCounter, OwnedByTheGraphWhileCapturing) {
  FA3_REQUIRE_HOPPER();
  Stream s;
  ASSERT_EQ(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
  TileCounter c;
  const Status acquired = acquire_tile_counter(s.get(), &c);
  const Status released = release_tile_counter(c, s.get());
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s.get(), &graph), cudaSuccess);
  EXPECT_TRUE(acquired.is_ok()) << acquired.to_string();
  EXPECT_TRUE(released.is_ok()) << released.to_string();
  EXPECT_NE(c.ptr, nullptr);
  EXPECT_TRUE(c.per_launch);
  ASSERT_NE(graph, nullptr);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cudaGraphLaunch(exec, s.get()), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Causal launches of several sizes on one stream, one after another without a
// synchronization between them: each finds the counter at zero and leaves it there.
TEST(TileCounter, CausalLaunchesLeaveItAtZero) {
  FA3_REQUIRE_HOPPER();
  const DType dtype = build_info().dtypes.front() == "fp16" ? DType::kFloat16 : DType::kBFloat16;
  const int d = build_info().head_dims.front();
  Stream s;
  for (const std::int64_t seqlen : {300, 1000, 2048}) {
    PaddedTensor q = make_tensor(dtype, 2, seqlen, 4, d, 1), k = make_tensor(dtype, 2, seqlen, 4, d, 2),
                 v = make_tensor(dtype, 2, seqlen, 4, d, 3), out = make_tensor(dtype, 2, seqlen, 4, d, 4);
    ForwardArgs args;
    args.q = q.view;
    args.k = k.view;
    args.v = v.view;
    args.out = out.view;
    args.options.causal = true;
    FA3_CUDA_CHECK(cudaDeviceSynchronize());  // the fills ran on the default stream
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(forward(args, s.get()).is_ok());
    TileCounter c;
    ASSERT_TRUE(acquire_tile_counter(s.get(), &c).is_ok());
    EXPECT_EQ(read_counter(c, s.get()), 0) << "seqlen " << seqlen;
  }
}

// Varlen launches draw from the counter where their order asks for it (causal ones, and
// every one in a build with FA3_VARLEN_DYNAMIC_ORDER): of mixed lengths, empty sequences
// among them and more sequences than a warp counts at a time, plain and causal, one
// after another on one stream, each finds it at zero and leaves it there.
TEST(TileCounter, VarlenLaunchesLeaveItAtZero) {
  FA3_REQUIRE_HOPPER();
  if (!hopper::fwd_varlen_enabled()) GTEST_SKIP() << "the GPU varlen forward is switched off (FA3_GPU_VARLEN)";
  const DType dtype = build_info().dtypes.front() == "fp16" ? DType::kFloat16 : DType::kBFloat16;
  const std::int64_t d = build_info().head_dims.front(), heads = 4;
  Mix mix{"mixed", {}};
  for (std::int32_t i = 0; i < 45; ++i) mix.seqs.push_back({i % 9 == 4 ? 0 : 1 + i * 67 % 700, 1 + i * 41 % 650});
  const VarlenIndex index(mix);
  PaddedTensor q = make_tensor(dtype, 1, index.total_q, heads, d, 1),
               k = make_tensor(dtype, 1, index.total_k, heads, d, 2),
               v = make_tensor(dtype, 1, index.total_k, heads, d, 3),
               out = make_tensor(dtype, 1, index.total_q, heads, d, 4);
  ForwardArgs args;
  args.q = TensorView::contiguous(q.view.data, dtype, {index.total_q, heads, d});
  args.k = TensorView::contiguous(k.view.data, dtype, {index.total_k, heads, d});
  args.v = TensorView::contiguous(v.view.data, dtype, {index.total_k, heads, d});
  args.out = TensorView::contiguous(out.view.data, dtype, {index.total_q, heads, d});
  args.varlen = index.varlen;
  Stream s;
  FA3_CUDA_CHECK(cudaDeviceSynchronize());  // the fills ran on the default stream
  for (const bool causal : {false, true, false}) {
    args.options.causal = causal;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(forward(args, s.get()).is_ok());
    TileCounter c;
    ASSERT_TRUE(acquire_tile_counter(s.get(), &c).is_ok());
    EXPECT_EQ(read_counter(c, s.get()), 0) << (causal ? "causal" : "non-causal");
  }
}

// Past the table's size, streams get a zeroed counter per launch, which release frees.
TEST(TileCounter, PerLaunchOnceTheTableIsFull) {
  FA3_REQUIRE_HOPPER();
  std::vector<cudaStream_t> streams(hopper::kMaxKeptCounters + 1);
  std::set<int*> kept;
  TileCounter last;
  for (cudaStream_t& s : streams) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    TileCounter c;
    ASSERT_TRUE(acquire_tile_counter(s, &c).is_ok());
    ASSERT_NE(c.ptr, nullptr);
    if (!c.per_launch) EXPECT_TRUE(kept.insert(c.ptr).second) << "two streams share a kept counter";
    last = c;
  }
  EXPECT_LE(kept.size(), hopper::kMaxKeptCounters);
  EXPECT_TRUE(last.per_launch);
  EXPECT_EQ(read_counter(last, streams.back()), 0);
  EXPECT_TRUE(release_tile_counter(last, streams.back()).is_ok());
  for (cudaStream_t s : streams) EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace
}  // namespace fa3::test
