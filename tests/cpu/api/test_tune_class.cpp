// The problem classes and keys of the tuning cache, where its file lives, and what
// fa3::tune_forward refuses on a machine without a Hopper GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "api/tune_class.h"
#include "api/tune_key.h"
#include "fa3/fa3.h"
#include "tune_test_util.h"
#include "valid_args.h"

namespace fa3::test {
namespace {

Problem problem(std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t nheads_q, std::int64_t nheads_kv,
                bool causal = false) {
  Problem p;
  p.batch = 2;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.nheads_q = nheads_q;
  p.nheads_kv = nheads_kv;
  p.head_dim = 128;
  p.softmax_scale = 0.1f;
  p.causal = causal;
  p.window_right = causal ? 0 : -1;
  return p;
}

TEST(TuneBucket, IsTheNextPowerOfTwo) {
  const std::pair<std::int64_t, std::int64_t> cases[] = {{1, 1},         {2, 2},
                                                         {3, 4},         {4, 4},
                                                         {5, 8},         {127, 128},
                                                         {128, 128},     {129, 256},
                                                         {1023, 1024},   {1024, 1024},
                                                         {1025, 2048},   {4224, 8192},
                                                         {16384, 16384}, {2147483647, std::int64_t{1} << 31}};
  for (const auto& [n, bucket] : cases) EXPECT_EQ(tune_bucket(n), bucket) << n;
}

TEST(TuneBucket, NamesOnlyPowersOfTwoUpTo2To31) {
  for (std::int64_t b : {std::int64_t{1}, std::int64_t{2}, std::int64_t{1024}, std::int64_t{1} << 31}) {
    EXPECT_TRUE(is_tune_bucket(b)) << b;
  }
  for (std::int64_t b :
       {std::int64_t{0}, std::int64_t{-2}, std::int64_t{3}, std::int64_t{1000}, std::int64_t{1} << 32}) {
    EXPECT_FALSE(is_tune_bucket(b)) << b;
  }
}

TEST(TuneClassOf, BucketsBothLengthsAndTheGqaRatio) {
  const TuneClass c = tune_class_of(problem(1000, 1025, 8, 2, true), DType::kFloat16);
  EXPECT_EQ(c.direction, TuneDirection::kForward);
  EXPECT_EQ(c.dtype, DType::kFloat16);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.causal);
  EXPECT_EQ(c.seqlen_q, 1024);
  EXPECT_EQ(c.seqlen_k, 2048);
  EXPECT_EQ(c.gqa, 4);
  EXPECT_EQ(c.describe(), "fwd fp16 hdim128 causal q<=1024 k<=2048 gqa4");
}

TEST(TuneClassOf, SharedWithinABucketOnly) {
  const TuneClass base = tune_class_of(problem(513, 513, 8, 8), DType::kBFloat16);
  EXPECT_EQ(tune_class_of(problem(1024, 1024, 8, 8), DType::kBFloat16), base);
  EXPECT_NE(tune_class_of(problem(512, 513, 8, 8), DType::kBFloat16), base) << "seqlen_q 512 is the bucket below";
  EXPECT_NE(tune_class_of(problem(513, 1025, 8, 8), DType::kBFloat16), base) << "seqlen_k 1025 is the bucket above";
  EXPECT_NE(tune_class_of(problem(513, 513, 8, 4), DType::kBFloat16), base) << "GQA 2 is not MHA";
  EXPECT_NE(tune_class_of(problem(513, 513, 8, 8, true), DType::kBFloat16), base) << "the mask counts";
  EXPECT_NE(tune_class_of(problem(513, 513, 8, 8), DType::kFloat16), base) << "the dtype counts";
  EXPECT_EQ(base.describe(), "fwd bf16 hdim128 plain q<=1024 k<=1024 gqa1");
}

TEST(TuneClassOf, GqaRatiosBucketAsLengthsDo) {
  EXPECT_EQ(tune_class_of(problem(64, 64, 8, 1), DType::kBFloat16).gqa, 8);   // MQA 8:1
  EXPECT_EQ(tune_class_of(problem(64, 64, 6, 2), DType::kBFloat16).gqa, 4);   // 3 -> 4
  EXPECT_EQ(tune_class_of(problem(64, 64, 40, 8), DType::kBFloat16).gqa, 8);  // 5 -> 8
}

TEST(TuneClass, OrderIsStrictAndConsistentWithEquality) {
  TuneClass a = tune_class_of(problem(64, 64, 8, 8), DType::kBFloat16);
  TuneClass b = a;
  EXPECT_FALSE(a < b);
  EXPECT_FALSE(b < a);
  b.seqlen_k *= 2;
  EXPECT_TRUE(a < b);
  EXPECT_FALSE(b < a);
  EXPECT_NE(a, b);
}

// The class needs a valid call: the validation's message comes back.
TEST(TuneClassOfArgs, RejectsWhatForwardRejects) {
  ValidArgs valid;
  ForwardArgs a = valid.forward();
  a.k.data = nullptr;
  TuneClass cls;
  const Status s = tune_class(a, &cls);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("k: data pointer is null"), std::string::npos) << s.message();
}

TEST(TuneKey, DescribesItselfAndCompares) {
  const TuneKey key = test_key();
  EXPECT_EQ(key.describe(), "NVIDIA H200, 132 SMs, CUDA driver 13.0, fa3 0.1.0");
  TuneKey other = key;
  EXPECT_EQ(other, key);
  other.cuda_driver = 12080;
  EXPECT_NE(other, key);
  EXPECT_EQ(other.describe(), "NVIDIA H200, 132 SMs, CUDA driver 12.8, fa3 0.1.0");
}

TEST(TuneKey, OfADeviceHoldsItsNameAndSmsAndThisBuildsVersion) {
  DeviceInfo device;
  device.present = true;
  device.index = 0;
  device.name = "NVIDIA H100 80GB HBM3";
  device.sm_count = 132;
  const TuneKey key = tune_key_of(device);
  EXPECT_EQ(key.gpu_name, device.name);
  EXPECT_EQ(key.sm_count, 132);
  EXPECT_EQ(key.fa3_version, build_info().version);
  EXPECT_GE(key.cuda_driver, 0);
}

TEST(TuneKey, CurrentNeedsADevice) {
  if (current_device().present) GTEST_SKIP() << "a CUDA device is present";
  TuneKey key;
  const Status s = current_tune_key(&key);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_NE(s.message().find("no CUDA device"), std::string::npos) << s.message();
}

// The location rules, each with the other variables set, so that precedence shows.
class TuneCachePath : public ::testing::Test {
 protected:
  const std::string file_ = "tune-NVIDIA-H200-132sm-cuda13.0-fa3-0.1.0.txt";
};

TEST_F(TuneCachePath, ExplicitFileWins) {
  ScopedEnv cache("FA3_TUNE_CACHE", "/data/caches/mine.txt");
  ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
  ScopedEnv home("HOME", "/home/u");
  EXPECT_EQ(tune_cache_path(test_key()), "/data/caches/mine.txt");
}

TEST_F(TuneCachePath, ThenXdgCacheHome) {
  ScopedEnv cache("FA3_TUNE_CACHE", "");
  ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
  ScopedEnv home("HOME", "/home/u");
  EXPECT_EQ(tune_cache_path(test_key()), "/xdg/fa3/" + file_);
}

TEST_F(TuneCachePath, RelativeXdgCacheHomeIsIgnored) {
  ScopedEnv cache("FA3_TUNE_CACHE", std::nullopt);
  ScopedEnv xdg("XDG_CACHE_HOME", "relative/cache");
  ScopedEnv home("HOME", "/home/u");
  EXPECT_EQ(tune_cache_path(test_key()), "/home/u/.cache/fa3/" + file_);
}

TEST_F(TuneCachePath, ThenHome) {
  ScopedEnv cache("FA3_TUNE_CACHE", std::nullopt);
  ScopedEnv xdg("XDG_CACHE_HOME", std::nullopt);
  ScopedEnv home("HOME", "/home/u");
  EXPECT_EQ(tune_cache_path(test_key()), "/home/u/.cache/fa3/" + file_);
}

TEST_F(TuneCachePath, NoneWithoutAnyVariable) {
  ScopedEnv cache("FA3_TUNE_CACHE", std::nullopt);
  ScopedEnv xdg("XDG_CACHE_HOME", std::nullopt);
  ScopedEnv home("HOME", std::nullopt);
  EXPECT_EQ(tune_cache_path(test_key()), "");
}

// The file name holds the key, so that machines sharing a home directory keep apart.
TEST_F(TuneCachePath, FileNameFollowsTheKeyAndNeedsNoQuoting) {
  ScopedEnv cache("FA3_TUNE_CACHE", std::nullopt);
  ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
  TuneKey key = test_key();
  key.gpu_name = "NVIDIA H100 80GB HBM3 / MIG 1g.10gb";
  key.sm_count = 16;
  key.cuda_driver = 12080;
  key.fa3_version = "0.2.0+local";
  EXPECT_EQ(tune_cache_path(key), "/xdg/fa3/tune-NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-16sm-cuda12.8-fa3-0.2.0-local.txt");
}

TEST(TuneForward, RefusesBadOptionsFirst) {
  ValidArgs valid;
  TuneResult r;
  TuneOptions o;
  o.iters = 0;
  Status s = tune_forward(valid.forward(), nullptr, &r, o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("options.iters must be from 1 to 1000000, got 0"), std::string::npos) << s.message();
  o = TuneOptions();
  o.warmup = -1;
  s = tune_forward(valid.forward(), nullptr, &r, o);
  EXPECT_NE(s.message().find("options.warmup must be from 0 to 1000000, got -1"), std::string::npos) << s.message();
}

TEST(TuneForward, NeedsAHopperGpu) {
  if (current_device().is_hopper()) GTEST_SKIP() << "a Hopper GPU is present";
  ValidArgs valid;
  TuneResult r;
  const Status s = tune_forward(valid.forward(), nullptr, &r);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_NE(s.message().find("needs a Hopper GPU"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace fa3::test
