// fa3::tune_forward on a Hopper GPU, and fa3::forward running the tuning cache's kernel
// when autotuning is on: its output is bit for bit that kernel's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/fa3.h"

namespace fa3::test {
namespace {

// GQA 8:2, unequal lengths, causal: the class fwd <dtype> hdim<d> causal q<=512 k<=1024 gqa4.
struct TuneInputs {
  PaddedTensor q, k, v, out, lse;
  ForwardArgs args;

  TuneInputs(DType dtype, int d) {
    q = make_tensor(dtype, 2, 300, 8, d, 1);
    k = make_tensor(dtype, 2, 700, 2, d, 2);
    v = make_tensor(dtype, 2, 700, 2, d, 3);
    out = make_tensor(dtype, 2, 300, 8, d, 4);
    lse = make_tensor(DType::kFloat32, 2, 8, 300, 1, 5);
    args.q = q.view;
    args.k = k.view;
    args.v = v.view;
    args.out = out.view;
    args.lse = lse.view;
    args.lse.rank = 3;
    args.options.causal = true;
  }
};

// The cache file of this test, named by FA3_TUNE_CACHE, removed (with its lock) at the end.
class TuneCacheFile {
 public:
  TuneCacheFile() : path_(::testing::TempDir() + "fa3_gpu_tune_" + std::to_string(getpid()) + ".txt") {
    setenv("FA3_TUNE_CACHE", path_.c_str(), 1);
  }
  ~TuneCacheFile() {
    unsetenv("FA3_TUNE_CACHE");
    std::remove(path_.c_str());
    std::remove((path_ + ".lock").c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::uint8_t> forward_bytes(TuneInputs& in, const std::string& kernel) {
  fill_nan(in.out.buffer.get(), in.args.out.dtype, in.out.total_elements);
  const Status s = kernel.empty() ? forward(in.args, nullptr) : forward_with_kernel(in.args, kernel, nullptr);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return in.out.buffer.to_host();
}

// One test: the process's cache is loaded once, so the order of events matters. A
// hand-written entry is used first; then tuning replaces it, in memory at once.
TEST(TuneForward, StoresTheFastestAndForwardRunsTheCachedKernel) {
  FA3_REQUIRE_HOPPER();
  if (!build_info().gpu_kernels) GTEST_SKIP() << "no GPU kernels built";
  const DType dtype = build_info().dtypes.front() == "fp16" ? DType::kFloat16 : DType::kBFloat16;
  TuneCacheFile file;
  TuneInputs in(dtype, build_info().head_dims.front());
  const std::vector<std::string> kernels = kernels_for(in.args);
  ASSERT_FALSE(kernels.empty());

  TuneKey key;
  ASSERT_TRUE(current_tune_key(&key).is_ok());
  TuneClass cls;
  ASSERT_TRUE(tune_class(in.args, &cls).is_ok());
  TuneEntry hand;
  hand.cls = cls;
  hand.kernel = kernels.back();
  hand.kernel_ms = hand.heuristic_ms = 1;
  hand.heuristic = kernels.front();
  ASSERT_TRUE(write_tune_cache(file.path(), key, {hand}).is_ok());

  const std::vector<std::uint8_t> chosen = forward_bytes(in, hand.kernel);
  set_autotune(true);
  EXPECT_EQ(forward_bytes(in, ""), chosen) << "autotuning on runs the cache's " << hand.kernel;
  set_autotune(false);
  EXPECT_EQ(forward_bytes(in, ""), forward_bytes(in, kernels.front())) << "off, the built-in choice runs";

  TuneOptions options;
  options.warmup = 1;
  options.iters = 5;
  TuneResult r;
  const Status s = tune_forward(in.args, nullptr, &r, options);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(r.cls, cls);
  EXPECT_EQ(r.kernels, kernels);
  ASSERT_EQ(r.median_ms.size(), kernels.size());
  for (double ms : r.median_ms) EXPECT_GT(ms, 0);
  EXPECT_EQ(r.entry.heuristic, kernels.front());
  EXPECT_EQ(r.entry.kernel_ms, *std::min_element(r.median_ms.begin(), r.median_ms.end()));
  EXPECT_EQ(r.cache_path, file.path());
  std::vector<TuneEntry> stored;
  ASSERT_TRUE(read_tune_cache(file.path(), key, &stored).is_ok());
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].kernel, r.entry.kernel);

  set_autotune(true);
  EXPECT_EQ(forward_bytes(in, ""), forward_bytes(in, r.entry.kernel)) << "the tuned kernel, without reloading";
  set_autotune(false);
}

TEST(TuneForward, DryRunStoresNothing) {
  FA3_REQUIRE_HOPPER();
  if (!build_info().gpu_kernels) GTEST_SKIP() << "no GPU kernels built";
  const DType dtype = build_info().dtypes.front() == "fp16" ? DType::kFloat16 : DType::kBFloat16;
  TuneCacheFile file;
  std::remove(file.path().c_str());
  TuneInputs in(dtype, build_info().head_dims.back());
  TuneOptions options;
  options.warmup = 0;
  options.iters = 1;
  options.store = false;
  TuneResult r;
  ASSERT_TRUE(tune_forward(in.args, nullptr, &r, options).is_ok());
  EXPECT_EQ(r.cache_path, "");
  EXPECT_FALSE(std::ifstream(file.path()).good());
}

}  // namespace
}  // namespace fa3::test
