// `fa3 tune` without a GPU to time: the command line is checked first (bad ones exit 2
// with the usage), then the run exits 1 saying why it cannot tune; --show likewise.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "fa3/device.h"

namespace fa3::test {
namespace {

struct BadTuneArgs {
  std::string name;
  std::string args;
  std::string error;  // a part of the error line
};

void PrintTo(const BadTuneArgs& b, std::ostream* os) { *os << "fa3 " << b.args; }

class CliTuneBadArgs : public ::testing::TestWithParam<BadTuneArgs> {};

TEST_P(CliTuneBadArgs, ExitsTwoWithErrorAndUsage) {
  const BadTuneArgs& b = GetParam();
  const CliResult r = run_cli(b.args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  const std::string first_line = r.err.substr(0, r.err.find('\n'));
  EXPECT_TRUE(starts_with(first_line, "fa3 tune: error: ")) << first_line;
  EXPECT_TRUE(contains(first_line, b.error)) << first_line << "\nexpected: " << b.error;
  EXPECT_TRUE(contains(r.err, "\nusage: fa3 tune")) << r.err;
}

INSTANTIATE_TEST_SUITE_P(
    Cli, CliTuneBadArgs,
    ::testing::Values(BadTuneArgs{"unknown_flag", "tune --kernel 128x128", "unknown option '--kernel'"},
                      BadTuneArgs{"fp32", "tune --dtype fp32", "--dtype fp32 has no GPU kernels to tune"},
                      BadTuneArgs{"sweep_and_problem", "tune --head-dim 128 --seqlens 512",
                                  "--head-dim (one problem) and --seqlens (a sweep) do not go together"},
                      BadTuneArgs{"problem_and_sweep", "tune --hidden 1024 --batch 2",
                                  "--batch (one problem) and --hidden (a sweep)"},
                      BadTuneArgs{"non_causal_one_problem", "tune --seqlen 64 --non-causal",
                                  "--seqlen (one problem) and --non-causal (a sweep)"},
                      BadTuneArgs{"show_with_flags", "tune --show --dry-run",
                                  "--show lists the cache and takes no other option, got --dry-run"},
                      BadTuneArgs{"flags_with_show", "tune --causal --show", "takes no other option, got --causal"},
                      BadTuneArgs{"gqa_not_dividing", "tune --head-dims 128 --gqa 1,3",
                                  "--gqa 3 does not divide nheads 16 (--hidden 2048 / head dim 128)"},
                      BadTuneArgs{"gqa_zero", "tune --gqa 0", "--gqa: 0 is out of range"},
                      BadTuneArgs{"heads_not_divisible", "tune --nheads 6 --nheads-kv 4",
                                  "--nheads-kv 4 must divide --nheads 6"},
                      BadTuneArgs{"iters_zero", "tune --iters 0", "--iters: 0 is out of range"},
                      BadTuneArgs{"warmup_negative", "tune --warmup -1", "--warmup: -1 is out of range"},
                      BadTuneArgs{"dry_run_with_value", "tune --dry-run=yes", "--dry-run takes no value"}),
    [](const auto& info) { return info.param.name; });

TEST(CliTune, HelpDocumentsEveryOption) {
  const CliResult r = run_cli("tune --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(starts_with(r.out, "usage: fa3 tune")) << r.out;
  for (const char* flag : {"--head-dims", "--seqlens",   "--causal",       "--non-causal",   "--gqa",       "--tokens",
                           "--hidden",    "--batch",     "--seqlen ",      "--seqlen-q",     "--seqlen-k",  "--nheads ",
                           "--nheads-kv", "--head-dim ", "--dtype",        "--warmup",       "--iters",     "--seed",
                           "--dry-run",   "--show",      "FA3_TUNE_CACHE", "XDG_CACHE_HOME", "FA3_AUTOTUNE"}) {
    EXPECT_TRUE(contains(r.out, flag)) << flag;
  }
  EXPECT_TRUE(contains(run_cli("--help").out, "\n  tune ")) << "listed among the commands";
}

// Without a usable GPU, tuning (dry run or not) and listing exit 1 with the reason.
TEST(CliTune, WithoutAGpuExitsOneSayingWhy) {
  const DeviceInfo device = current_device();
  if (device.is_hopper() && build_info().gpu_kernels) GTEST_SKIP() << "this machine can tune";
  for (const char* args : {"tune", "tune --dry-run --head-dims 64 --seqlens 128", "tune --head-dim 64 --seqlen 128"}) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
    EXPECT_TRUE(starts_with(r.err, "fa3 tune: tuning times the GPU kernels, which cannot run here: ")) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  if (device.present) return;
  const CliResult show = run_cli("tune --show");
  EXPECT_EQ(show.exit_code, 1) << show.err;
  EXPECT_TRUE(starts_with(show.err, "fa3 tune: --show: no CUDA device to key a tuning cache by: ")) << show.err;
}

// On a machine that can tune: one problem, stored in a cache of the test's own, then
// listed by --show; a dry run leaves the cache alone.
TEST(CliTune, OnAGpuTunesStoresAndShows) {
  if (!current_device().is_hopper() || !build_info().gpu_kernels) GTEST_SKIP() << "needs a Hopper GPU and kernels";
  const std::string cache = temp_path("cache.txt");
  setenv("FA3_TUNE_CACHE", cache.c_str(), 1);
  const std::string problem = "--head-dim " + std::to_string(build_info().head_dims.front()) + " --dtype " +
                              build_info().dtypes.front() + " --seqlen 300 --causal --iters 3 --warmup 1";
  const CliResult dry = run_cli("tune --dry-run " + problem);
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_TRUE(contains(dry.out, "cache: not written (--dry-run): " + cache)) << dry.out;
  EXPECT_TRUE(read_file(cache).empty()) << "no file yet";

  const CliResult tuned = run_cli("tune " + problem);
  EXPECT_EQ(tuned.exit_code, 0) << tuned.err;
  EXPECT_TRUE(starts_with(tuned.out, "fa3 tune: ")) << tuned.out;
  EXPECT_TRUE(contains(tuned.out, "causal q<=512 k<=512 gqa1")) << tuned.out;
  EXPECT_TRUE(contains(tuned.out, "cache: 1 entry added to " + cache)) << tuned.out;

  const CliResult show = run_cli("tune --show");
  EXPECT_EQ(show.exit_code, 0) << show.err;
  EXPECT_TRUE(contains(show.out, "cache: " + cache)) << show.out;
  EXPECT_TRUE(contains(show.out, "causal q<=512 k<=512 gqa1")) << show.out;
  EXPECT_TRUE(contains(show.out, "\n1 entry\n")) << show.out;
  unsetenv("FA3_TUNE_CACHE");
  std::remove(cache.c_str());
  std::remove((cache + ".lock").c_str());
}

}  // namespace
}  // namespace fa3::test
