// `fa3 info` runs on any machine and reports the build and the device.
#include <gtest/gtest.h>

#include <string>

#include "cli_runner.h"
#include "fa3/device.h"

namespace fa3::test {
namespace {

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

TEST(CliInfo, ListsTheBuild) {
  const CliResult r = run_cli("info");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const BuildInfo& b = build_info();
  EXPECT_TRUE(starts_with(r.out, "fa3 " + b.version + "\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "CUDA toolkit    " + b.cuda_version)) << r.out;
  EXPECT_TRUE(contains(r.out, "CUTLASS         " + b.cutlass_version)) << r.out;
  if (b.gpu_kernels) {
    EXPECT_TRUE(contains(r.out, "head dims " + joined(b.head_dims) + "; dtypes " + joined(b.dtypes))) << r.out;
  } else {
    EXPECT_TRUE(contains(r.out, "none (built without GPU kernels)")) << r.out;
  }
  EXPECT_TRUE(
      contains(r.out, "CPU path        dtypes fp32, fp16, bf16; head dims 1 to 256, V head dims (v, out) 1 to 512\n"))
      << r.out;
}

TEST(CliInfo, ReportsTheDeviceOrItsAbsence) {
  const CliResult r = run_cli("info");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const DeviceInfo d = current_device();
  if (d.present) {
    EXPECT_TRUE(contains(r.out, d.name)) << r.out;
    EXPECT_TRUE(contains(r.out, std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor))) << r.out;
    EXPECT_TRUE(contains(r.out, "SMs             " + std::to_string(d.sm_count))) << r.out;
  } else {
    EXPECT_TRUE(contains(r.out, "GPU             none: ")) << r.out;
  }
  const bool runnable = d.is_hopper() && build_info().gpu_kernels;
  EXPECT_TRUE(contains(r.out, runnable ? "kernels run     yes" : "kernels run     no: ")) << r.out;
}

}  // namespace
}  // namespace fa3::test
