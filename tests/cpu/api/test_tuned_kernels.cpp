// fa3::forward's use of the tuning cache, on the host: the switch, each device's cache
// loaded once, and every cache that cannot be trusted (corrupt, truncated, another key
// or format version, a kernel this build lacks) ignored whole with one warning, so that
// the built-in choice runs. The build's kernel list is stood in for by a fixed one.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "api/autotune_switch.h"
#include "api/tune_class.h"
#include "api/tune_format.h"
#include "api/tune_key.h"
#include "api/tuned_kernels.h"
#include "tune_test_util.h"

namespace fa3::test {
namespace {

DeviceInfo fake_device(int index, const std::string& name = "NVIDIA H200") {
  DeviceInfo d;
  d.present = true;
  d.index = index;
  d.name = name;
  d.cc_major = 9;
  d.sm_count = 132;
  return d;
}

// Head dim 128 has two kernels for each dtype and mask; no other head dim has any.
std::vector<std::string> fake_kernels(const TuneClass& cls) {
  if (cls.head_dim != 128) return {};
  return cls.causal ? std::vector<std::string>{"128x128", "128x176"}
                    : std::vector<std::string>{"128x128", "128x128-c2"};
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A registry over fake_kernels whose warnings are collected, and a cache file (at
// FA3_TUNE_CACHE) for fake_device's key.
class TunedKernelsTest : public ::testing::Test {
 protected:
  TunedKernels registry_{fake_kernels, [this](const std::string& m) { warnings_.push_back(m); }};
  std::vector<std::string> warnings_;
  ScratchDir dir_;
  std::string path_ = dir_.file("cache.txt");
  ScopedEnv env_{"FA3_TUNE_CACHE", path_};
  TuneKey key_ = tune_key_of(fake_device(0));

  TuneClass cls(std::int64_t seqlen, bool causal = false) const { return test_entry(seqlen, "", causal).cls; }
  void write_cache(const std::vector<TuneEntry>& entries) { write_text(path_, format_tune_cache(key_, entries)); }
  // Looks up one class on two devices, twice each: the cache is ignored on both, with one
  // warning that holds `why`.
  void expect_ignored_with_one_warning(const std::string& why) {
    for (int round = 0; round < 2; ++round) {
      for (int device : {0, 1}) EXPECT_EQ(registry_.lookup(fake_device(device), cls(1024)), "");
    }
    ASSERT_EQ(warnings_.size(), 1u);
    EXPECT_NE(warnings_[0].find("ignoring the tuning cache: "), std::string::npos) << warnings_[0];
    EXPECT_NE(warnings_[0].find(why), std::string::npos) << warnings_[0] << "\nexpected: " << why;
    EXPECT_NE(warnings_[0].find("fa3::forward uses its built-in kernel choice"), std::string::npos) << warnings_[0];
    EXPECT_EQ(registry_.loads(), 2) << "once per device";
  }
};

TEST_F(TunedKernelsTest, ValidEntriesAreUsed) {
  write_cache({test_entry(1024, "128x128-c2"), test_entry(1024, "128x176", true)});
  EXPECT_EQ(registry_.lookup(fake_device(0), cls(1024)), "128x128-c2");
  EXPECT_EQ(registry_.lookup(fake_device(0), cls(1024, true)), "128x176");
  EXPECT_EQ(registry_.lookup(fake_device(0), cls(2048)), "") << "a class the cache lacks: the built-in choice";
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(TunedKernelsTest, EachDeviceLoadsOnce) {
  write_cache({test_entry(1024)});
  for (int i = 0; i < 3; ++i) registry_.lookup(fake_device(0), cls(1024));
  EXPECT_EQ(registry_.loads(), 1);
  // Later changes to the file are not seen by a loaded device...
  write_cache({test_entry(1024, "128x128")});
  EXPECT_EQ(registry_.lookup(fake_device(0), cls(1024)), "128x128-c2");
  // ...but a device loading now reads the file as it is.
  EXPECT_EQ(registry_.lookup(fake_device(3), cls(1024)), "128x128");
  EXPECT_EQ(registry_.loads(), 2);
}

TEST_F(TunedKernelsTest, MissingCacheIsNoWarning) {
  EXPECT_EQ(registry_.lookup(fake_device(0), cls(1024)), "");
  EXPECT_TRUE(warnings_.empty());
  EXPECT_EQ(registry_.loads(), 1);
}

TEST_F(TunedKernelsTest, RememberedEntriesAreUsedAtOnce) {
  registry_.remember(fake_device(0), test_entry(1024));
  EXPECT_EQ(registry_.loads(), 0) << "remembering loads nothing";
  EXPECT_EQ(registry_.lookup(fake_device(0), cls(1024)), "") << "not loaded: the (missing) file counts";
  registry_.remember(fake_device(0), test_entry(1024));
  EXPECT_EQ(registry_.lookup(fake_device(0), cls(1024)), "128x128-c2");
}

TEST_F(TunedKernelsTest, CorruptCacheIsIgnored) {
  std::string text = format_tune_cache(key_, {test_entry(1024), test_entry(2048)});
  text.replace(text.find("bf16"), 4, std::string("\0\xff\xfe\x01", 4));
  write_text(path_, text);
  expect_ignored_with_one_warning("'" + path_ + "': line 7: unknown dtype");
}

TEST_F(TunedKernelsTest, TruncatedCacheIsIgnored) {
  const std::string text = format_tune_cache(key_, {test_entry(1024), test_entry(2048)});
  write_text(path_, text.substr(0, text.size() - 8));
  expect_ignored_with_one_warning("truncated");
}

TEST_F(TunedKernelsTest, ForeignKeyCacheIsIgnored) {
  TuneKey other = key_;
  other.sm_count = 114;
  write_text(path_, format_tune_cache(other, {test_entry(1024)}));
  expect_ignored_with_one_warning("written for NVIDIA H200, 114 SMs");
}

TEST_F(TunedKernelsTest, OtherFa3VersionIsIgnored) {
  TuneKey other = key_;
  other.fa3_version = "0.0.1";
  write_text(path_, format_tune_cache(other, {test_entry(1024)}));
  expect_ignored_with_one_warning("fa3 0.0.1");
}

TEST_F(TunedKernelsTest, OtherFormatVersionIsIgnored) {
  std::string text = format_tune_cache(key_, {test_entry(1024)});
  text.replace(text.find("cache\t1"), 7, "cache\t9");
  write_text(path_, text);
  expect_ignored_with_one_warning("format version 9; this fa3 reads version 1");
}

// One entry naming a kernel this build lacks condemns the whole file: it was written by a
// build with other kernels, whose other entries cannot be trusted either.
TEST_F(TunedKernelsTest, UnknownKernelNameIsIgnored) {
  write_cache({test_entry(1024, "128x128-c2"), test_entry(2048, "192x128")});
  expect_ignored_with_one_warning(
      "the entry for fwd bf16 hdim128 plain q<=2048 k<=2048 gqa1 names kernel '192x128', which this build lacks "
      "for that problem (built: 128x128, 128x128-c2)");
  EXPECT_EQ(registry_.lookup(fake_device(0), cls(2048)), "");
}

TEST_F(TunedKernelsTest, KernelOfAnotherMaskIsUnknown) {
  write_cache({test_entry(1024, "128x176")});  // a causal kernel, for a plain class
  expect_ignored_with_one_warning("names kernel '128x176'");
}

TEST_F(TunedKernelsTest, HeadDimWithoutKernelsNamesNone) {
  TuneEntry e = test_entry(1024);
  e.cls.head_dim = 64;
  write_cache({e});
  expect_ignored_with_one_warning("(built: none)");
}

TEST_F(TunedKernelsTest, NoCacheLocationIsIgnoredWithAWarning) {
  ScopedEnv cache("FA3_TUNE_CACHE", std::nullopt);
  ScopedEnv xdg("XDG_CACHE_HOME", std::nullopt);
  ScopedEnv home("HOME", std::nullopt);
  expect_ignored_with_one_warning("path: empty");
}

TEST_F(TunedKernelsTest, ConcurrentLookupsLoadOnceAndAgree) {
  write_cache({test_entry(1024), test_entry(2048, "128x128")});
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (registry_.lookup(fake_device(0), cls(1024)) != "128x128-c2") ++wrong;
        if (registry_.lookup(fake_device(0), cls(2048)) != "128x128") ++wrong;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(registry_.loads(), 1);
}

TEST(AutotuneEnv, OnlyAffirmativeValuesTurnItOn) {
  for (const char* on : {"1", "true", "TRUE", "Yes", "on"}) EXPECT_TRUE(autotune_env_enables(on)) << on;
  for (const char* off : {"0", "", "false", "no", "off", "2", " 1", "enable"}) {
    EXPECT_FALSE(autotune_env_enables(off)) << off;
  }
  EXPECT_FALSE(autotune_env_enables(nullptr));
}

// The process's own registry, as fa3::forward reaches it. One test, since that state
// lives for the whole process: off by default, off touches nothing (not even a corrupt
// cache), on loads each device's cache once and warns once on stderr.
TEST(ProcessTunedKernels, SwitchOffByDefaultTouchesNothingThenOnWarnsOnce) {
  if (std::getenv("FA3_AUTOTUNE") != nullptr) GTEST_SKIP() << "FA3_AUTOTUNE is set for this process";
  ScratchDir dir;
  ScopedEnv env("FA3_TUNE_CACHE", dir.file("cache.txt"));
  write_text(dir.file("cache.txt"), "corrupt\n");
  Problem p;
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = 1000;
  p.nheads_q = p.nheads_kv = 8;
  p.head_dim = p.head_dim_v = 128;

  EXPECT_FALSE(autotune_enabled());
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(tuned_forward_kernel(p, DType::kBFloat16, fake_device(0)), "");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(process_tuned_kernels().loads(), 0) << "autotuning off reads no file";

  set_autotune(true);
  EXPECT_TRUE(autotune_enabled());
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    for (int device : {0, 1}) EXPECT_EQ(tuned_forward_kernel(p, DType::kBFloat16, fake_device(device)), "");
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_autotune(false);
  EXPECT_EQ(process_tuned_kernels().loads(), 2);
  EXPECT_EQ(err.rfind("fa3: warning: ignoring the tuning cache: '" + dir.file("cache.txt") + "': line 1", 0), 0u)
      << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "one line:\n" << err;
  EXPECT_FALSE(autotune_enabled());
}

}  // namespace
}  // namespace fa3::test
