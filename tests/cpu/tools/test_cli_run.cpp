// `fa3 run`: the CPU path on small shapes passes its own check against the exact
// reference and prints the error; the bare command works with its defaults.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ostream>
#include <string>

#include "cli_runner.h"
#include "fa3/device.h"

namespace fa3::test {
namespace {

// The number after `label` on the report's line, e.g. "max |out - ref| 3.1e-04".
double number_after(const std::string& out, const std::string& label) {
  const std::size_t at = out.find(label);
  if (at == std::string::npos) return -1;
  return std::strtod(out.c_str() + at + label.size(), nullptr);
}

struct RunCase {
  std::string name;
  std::string args;     // appended to "run --device cpu --iters 1 --warmup 0"
  std::string problem;  // the report's problem line
  double bound;
};

void PrintTo(const RunCase& c, std::ostream* os) { *os << c.args; }

class CliRunCpu : public ::testing::TestWithParam<RunCase> {};

TEST_P(CliRunCpu, PassesItsCheck) {
  const RunCase& c = GetParam();
  const CliResult r = run_cli("run --device cpu --iters 1 --warmup 0 " + c.args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_TRUE(contains(r.out, "path     cpu, fa3::cpu::forward (requested)")) << r.out;
  EXPECT_TRUE(contains(r.out, "problem  " + c.problem + "\n")) << r.out;
  EXPECT_TRUE(contains(r.out, " TFLOP/s")) << r.out;
  EXPECT_TRUE(contains(r.out, "rows vs the exact reference")) << r.out;
  const double out_error = number_after(r.out, "max |out - ref| ");
  const double lse_error = number_after(r.out, "max |lse - ref| ");
  EXPECT_GE(out_error, 0) << r.out;
  EXPECT_LE(out_error, c.bound) << r.out;
  EXPECT_GE(lse_error, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "(bound ")) << r.out;
  EXPECT_TRUE(contains(r.out, "result   PASS\n")) << r.out;
}

INSTANTIATE_TEST_SUITE_P(
    Cli, CliRunCpu,
    ::testing::Values(
        RunCase{"bf16_gqa_causal", "--batch 2 --seqlen-q 70 --seqlen-k 90 --nheads 4 --nheads-kv 2 --head-dim 64 --causal",
                "batch 2, seqlen_q 70, seqlen_k 90, nheads 4 (kv 2), head dim 64, bf16, causal", 2e-2},
        RunCase{"fp16_mqa", "--dtype fp16 --seqlen 65 --nheads 3 --nheads-kv 1 --head-dim 40",
                "batch 1, seqlen_q 65, seqlen_k 65, nheads 3 (kv 1), head dim 40, fp16", 4e-3},
        RunCase{"fp32_window_softcap_scale",
                "--dtype fp32 --seqlen 80 --nheads 2 --head-dim 32 --window 8,3 --softcap 20 --scale 0.3",
                "batch 1, seqlen_q 80, seqlen_k 80, nheads 2 (kv 2), head dim 32, fp32, window (8, 3), softcap 20, "
                "scale 0.3",
                1e-5},
        // More queries than keys, causal: the first rows see no key (out 0, lse -inf).
        RunCase{"masked_rows_all_checked",
                "--seqlen-q 40 --seqlen-k 8 --nheads 2 --head-dim 16 --causal --check-rows 1000",
                "batch 1, seqlen_q 40, seqlen_k 8, nheads 2 (kv 2), head dim 16, bf16, causal", 2e-2},
        RunCase{"bf16_sinks_every_head", "--seqlen 70 --nheads 4 --nheads-kv 2 --head-dim 32 --sinks 1.5",
                "batch 1, seqlen_q 70, seqlen_k 70, nheads 4 (kv 2), head dim 32, bf16, sinks 1.5", 2e-2},
        // One sink per head; rows that see no key keep only their sink (lse = the sink).
        RunCase{"fp32_sinks_per_head_masked_rows",
                "--dtype fp32 --batch 2 --seqlen-q 40 --seqlen-k 30 --nheads 4 --nheads-kv 2 --head-dim 32 --causal "
                "--sinks 0.5,-1,2,3 --check-rows 1000",
                "batch 2, seqlen_q 40, seqlen_k 30, nheads 4 (kv 2), head dim 32, fp32, causal, sinks (0.5, -1, 2, 3)",
                1e-5},
        // V head dims of their own: DeepSeek-V3's (192, 128), and 512 against q's 64, every row.
        RunCase{"bf16_head_dim_v_deepseek",
                "--batch 2 --seqlen-q 70 --seqlen-k 90 --nheads 4 --nheads-kv 2 --head-dim 192 --head-dim-v 128 "
                "--causal",
                "batch 2, seqlen_q 70, seqlen_k 90, nheads 4 (kv 2), head dim 192 (v 128), bf16, causal", 2e-2},
        RunCase{"fp32_head_dim_v_512_all_rows",
                "--dtype fp32 --seqlen 40 --nheads 2 --head-dim 64 --head-dim-v 512 --window 6,2 --check-rows 1000",
                "batch 1, seqlen_q 40, seqlen_k 40, nheads 2 (kv 2), head dim 64 (v 512), fp32, window (6, 2)", 1e-5},
        // FP8: e4m3 inputs, bf16 out, the P rounding's bound; causal with GQA, every row.
        RunCase{"e4m3_gqa_causal_all_rows",
                "--dtype e4m3 --batch 2 --seqlen-q 70 --seqlen-k 90 --nheads 4 --nheads-kv 2 --head-dim 64 --causal "
                "--check-rows 1000",
                "batch 2, seqlen_q 70, seqlen_k 90, nheads 4 (kv 2), head dim 64, e4m3, causal", 1e-1},
        // --head-dim-v equal to --head-dim is the plain problem.
        RunCase{"head_dim_v_same", "--seqlen 33 --nheads 2 --head-dim 48 --head-dim-v 48",
                "batch 1, seqlen_q 33, seqlen_k 33, nheads 2 (kv 2), head dim 48, bf16", 2e-2}),
    [](const auto& info) { return info.param.name; });

TEST(CliRun, ChecksAllRowsWhenAskedForMore) {
  const CliResult r = run_cli("run --device cpu --iters 1 --warmup 0 --seqlen-q 40 --seqlen-k 8 --nheads 2 "
                              "--head-dim 16 --check-rows 1000");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "check    80 rows vs the exact reference")) << r.out;
}

TEST(CliRun, NoRowsStillScansForNaN) {
  const CliResult r = run_cli("run --device cpu --iters 1 --warmup 0 --seqlen 16 --head-dim 16 --check-rows 0");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "no rows compared")) << r.out;
  EXPECT_TRUE(contains(r.out, "result   PASS")) << r.out;
}

// The defaults (batch 1, seqlen 512, 8 heads, head dim 128, bf16) finish in seconds on
// a small CPU and pick the GPU on a Hopper machine.
TEST(CliRun, BareCommandWorks) {
  const CliResult r = run_cli("run");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "problem  batch 1, seqlen_q 512, seqlen_k 512, nheads 8 (kv 8), head dim 128, bf16\n"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "check    16 rows vs the exact reference")) << r.out;
  EXPECT_TRUE(contains(r.out, "result   PASS")) << r.out;
  const bool gpu = current_device().is_hopper() && build_info().gpu_kernels;
  EXPECT_TRUE(contains(r.out, gpu ? "path     gpu, fa3::forward on " : "path     cpu, fa3::cpu::forward (")) << r.out;
}

TEST(CliRun, LibraryRejectionExitsOne) {
  const CliResult r = run_cli("run --device cpu --seqlen 4 --nheads 1 --head-dim 300");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(r.err, "fa3 run: not supported: q: head dim 300 is not supported; supported: 1 to 256\n");
}

TEST(CliRun, HeadDimVPastTheCpuPathsExitsOne) {
  const CliResult r = run_cli("run --device cpu --seqlen 4 --nheads 1 --head-dim 64 --head-dim-v 600");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(r.err, "fa3 run: not supported: v: head dim 600 is not supported; supported: 1 to 512\n");
}

// FLOPs count q . k over q's head dim and P v over v's: 2 x 2 heads x 64 x 64 x (192 +
// 64) = 4.19 MFLOP.
TEST(CliRun, CountsEachHeadDimsFlops) {
  const CliResult r =
      run_cli("run --device cpu --iters 1 --warmup 0 --seqlen 64 --nheads 2 --head-dim 192 --head-dim-v 64");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, " TFLOP/s (0.00419 GFLOP)")) << r.out;
}

TEST(CliRun, GpuRequestWithoutHopperExitsOne) {
  if (current_device().is_hopper() && build_info().gpu_kernels) GTEST_SKIP() << "a usable Hopper GPU is present";
  const CliResult r = run_cli("run --device gpu --seqlen 16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(starts_with(r.err, "fa3 run: --device gpu: ")) << r.err;
}

}  // namespace
}  // namespace fa3::test
