// `fa3 run --backward`: the CPU path on small shapes passes its own check of out, lse,
// dq, dk and dv against the exact reference and reports each error; --deterministic
// adds the repeat check; the bare command works with its defaults.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ostream>
#include <string>

#include "cli_runner.h"
#include "fa3/device.h"

namespace fa3::test {
namespace {

// The number after `label` on the report, e.g. "max |dq - ref| 3.1e-04"; -1 if absent.
double number_after(const std::string& out, const std::string& label, std::size_t from = 0) {
  const std::size_t at = out.find(label, from);
  if (at == std::string::npos) return -1;
  return std::strtod(out.c_str() + at + label.size(), nullptr);
}

// The line of the report that starts with `key`.
std::string line_of(const std::string& out, const std::string& key) {
  const std::size_t at = out.find("\n  " + key + " ");
  if (at == std::string::npos) return "";
  const std::size_t end = out.find('\n', at + 1);
  return out.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
}

struct BackwardCase {
  std::string name;
  std::string args;     // appended to "run --backward --device cpu --iters 1 --warmup 0"
  std::string problem;  // the report's problem line
  double bound;         // of the dtype: 2e-2 bf16, 4e-3 fp16, 1e-5 fp32
};

void PrintTo(const BackwardCase& c, std::ostream* os) { *os << c.args; }

class CliRunBackwardCpu : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(CliRunBackwardCpu, PassesItsCheck) {
  const BackwardCase& c = GetParam();
  const CliResult r = run_cli("run --backward --device cpu --iters 1 --warmup 0 " + c.args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_TRUE(starts_with(r.out, "fa3 run --backward\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "path     cpu, fa3::cpu::backward (requested)")) << r.out;
  EXPECT_TRUE(contains(r.out, "problem  " + c.problem + "\n")) << r.out;
  EXPECT_TRUE(contains(r.out, " GFLOP, 2.5x the forward's)")) << r.out;
  EXPECT_FALSE(contains(r.out, "kernel ")) << "no GPU kernel ran:\n" << r.out;
  EXPECT_FALSE(contains(r.out, "repeat ")) << r.out;
  EXPECT_LE(number_after(r.out, "max |out - ref| "), c.bound) << r.out;
  for (const char* grad : {"dq", "dk", "dv"}) {
    const std::string line = line_of(r.out, grad);
    ASSERT_FALSE(line.empty()) << grad << " line missing:\n" << r.out;
    EXPECT_TRUE(contains(line, "vs the exact reference")) << line;
    const double error = number_after(line, std::string("max |") + grad + " - ref| ");
    const double bound = number_after(line, "(bound ");
    const double max_ref = number_after(line, "max |ref| ");
    EXPECT_GE(error, 0) << line;
    EXPECT_LE(error, bound) << line;
    EXPECT_GT(max_ref, 0) << line;
    // The bound as usage documents it (both printed to two significant digits).
    EXPECT_NEAR(bound, c.bound * max_ref + 1e-5, 0.1 * bound) << line;
  }
  EXPECT_TRUE(contains(r.out, "result   PASS\n")) << r.out;
}

INSTANTIATE_TEST_SUITE_P(
    Cli, CliRunBackwardCpu,
    ::testing::Values(
        BackwardCase{"bf16_gqa_causal",
                     "--batch 2 --seqlen-q 70 --seqlen-k 90 --nheads 4 --nheads-kv 2 --head-dim 64 --causal",
                     "batch 2, seqlen_q 70, seqlen_k 90, nheads 4 (kv 2), head dim 64, bf16, causal", 2e-2},
        BackwardCase{"fp16_mqa", "--dtype fp16 --seqlen 65 --nheads 3 --nheads-kv 1 --head-dim 40",
                     "batch 1, seqlen_q 65, seqlen_k 65, nheads 3 (kv 1), head dim 40, fp16", 4e-3},
        BackwardCase{"fp32_window_softcap_scale_all_rows",
                     "--dtype fp32 --seqlen-q 50 --seqlen-k 44 --nheads 2 --head-dim 24 --window 8,3 --softcap 20 "
                     "--scale 0.3 --check-rows 1000",
                     "batch 1, seqlen_q 50, seqlen_k 44, nheads 2 (kv 2), head dim 24, fp32, window (8, 3), "
                     "softcap 20, scale 0.3",
                     1e-5},
        // More queries than keys, causal: the first rows see no key (zero dq, and no
        // share in dk or dv).
        BackwardCase{"masked_rows_all_checked",
                     "--seqlen-q 40 --seqlen-k 8 --nheads 2 --head-dim 16 --causal --check-rows 1000",
                     "batch 1, seqlen_q 40, seqlen_k 8, nheads 2 (kv 2), head dim 16, bf16, causal", 2e-2},
        // dq, dk and dv with sinks (lse includes them), rows that see no key included.
        BackwardCase{"fp32_gqa_causal_sinks_all_rows",
                     "--dtype fp32 --seqlen-q 30 --seqlen-k 20 --nheads 4 --nheads-kv 2 --head-dim 16 --causal "
                     "--sinks 1,-2,0.5,3 --check-rows 1000",
                     "batch 1, seqlen_q 30, seqlen_k 20, nheads 4 (kv 2), head dim 16, fp32, causal, "
                     "sinks (1, -2, 0.5, 3)",
                     1e-5},
        // V head dims of their own: dv has v's, dq and dk q's.
        BackwardCase{"bf16_head_dim_v_deepseek",
                     "--batch 2 --seqlen-q 70 --seqlen-k 90 --nheads 4 --nheads-kv 2 --head-dim 192 "
                     "--head-dim-v 128 --causal",
                     "batch 2, seqlen_q 70, seqlen_k 90, nheads 4 (kv 2), head dim 192 (v 128), bf16, causal", 2e-2},
        BackwardCase{"fp32_head_dim_v_wider_all_rows",
                     "--dtype fp32 --seqlen-q 30 --seqlen-k 20 --nheads 4 --nheads-kv 2 --head-dim 16 "
                     "--head-dim-v 40 --causal --sinks 1,-2,0.5,3 --check-rows 1000",
                     "batch 1, seqlen_q 30, seqlen_k 20, nheads 4 (kv 2), head dim 16 (v 40), fp32, causal, "
                     "sinks (1, -2, 0.5, 3)",
                     1e-5}),
    [](const auto& info) { return info.param.name; });

TEST(CliRunBackward, ChecksAsManyKeyRowsAsQueryRows) {
  const CliResult r = run_cli("run --backward --device cpu --seqlen-q 40 --seqlen-k 8 --nheads 4 --nheads-kv 2 "
                              "--head-dim 16 --check-rows 5");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "check    5 rows vs the exact reference")) << r.out;
  EXPECT_TRUE(contains(r.out, "dq       5 query rows vs the exact reference")) << r.out;
  EXPECT_TRUE(contains(r.out, "dk       5 key rows vs the exact reference")) << r.out;
  EXPECT_TRUE(contains(r.out, "dv       5 key rows vs the exact reference")) << r.out;
  // All of them, when asked for more than there are: 2 KV heads x 8 keys.
  const CliResult all = run_cli("run --backward --device cpu --seqlen-q 40 --seqlen-k 8 --nheads 4 --nheads-kv 2 "
                                "--head-dim 16 --check-rows 1000");
  ASSERT_EQ(all.exit_code, 0) << all.out << all.err;
  EXPECT_TRUE(contains(all.out, "dq       160 query rows")) << all.out;
  EXPECT_TRUE(contains(all.out, "dk       16 key rows")) << all.out;
}

TEST(CliRunBackward, CountsTwoAndAHalfForwardPasses) {
  // Forward: 4 x 1 x 2 heads x 64 x 64 x 32 = 1.05 MFLOP; the backward 2.62 MFLOP.
  const CliResult r = run_cli("run --backward --device cpu --seqlen 64 --nheads 2 --head-dim 32");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, " TFLOP/s (0.00262 GFLOP, 2.5x the forward's)")) << r.out;
  EXPECT_TRUE(contains(r.out, "(median of 1, ")) << "one timed call by default on the CPU:\n" << r.out;
}

TEST(CliRunBackward, DeterministicComparesTheLastCallWithTheFirst) {
  const CliResult r = run_cli("run --backward --deterministic --device cpu --iters 2 --warmup 1 --seqlen 33 "
                              "--nheads 2 --nheads-kv 1 --head-dim 16 --causal");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(starts_with(r.out, "fa3 run --backward --deterministic\n")) << r.out;
  // One untimed call, one warm-up, two timed.
  EXPECT_TRUE(contains(r.out, "repeat   dq, dk, dv of the last of 4 calls bitwise equal to the first's\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "result   PASS\n")) << r.out;
}

TEST(CliRunBackward, NoRowsStillScansForNaN) {
  const CliResult r = run_cli("run --backward --device cpu --seqlen 16 --head-dim 16 --check-rows 0");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "dq       no rows compared (--check-rows 0); NaN scan of dq only")) << r.out;
  EXPECT_TRUE(contains(r.out, "dv       no rows compared (--check-rows 0); NaN scan of dv only")) << r.out;
  EXPECT_TRUE(contains(r.out, "result   PASS")) << r.out;
}

// The defaults (batch 1, seqlen 512, 8 heads, head dim 128, bf16) finish in seconds on
// a small CPU, the check included, and pick the GPU on a Hopper machine.
TEST(CliRunBackward, BareCommandWorks) {
  const CliResult r = run_cli("run --backward");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "problem  batch 1, seqlen_q 512, seqlen_k 512, nheads 8 (kv 8), head dim 128, bf16\n"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "dk       16 key rows vs the exact reference")) << r.out;
  EXPECT_TRUE(contains(r.out, "result   PASS")) << r.out;
  const bool gpu = current_device().is_hopper() && build_info().gpu_kernels;
  EXPECT_TRUE(contains(r.out, gpu ? "path     gpu, fa3::backward on " : "path     cpu, fa3::cpu::backward (")) << r.out;
  if (gpu) EXPECT_TRUE(contains(r.out, "; backward workspace ")) << r.out;
}

TEST(CliRunBackward, LibraryRejectionExitsOne) {
  const CliResult r = run_cli("run --backward --device cpu --seqlen 4 --nheads 1 --head-dim 300");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(r.err, "fa3 run: not supported: q: head dim 300 is not supported; supported: 1 to 256\n");
}

TEST(CliRunBackward, GpuRequestWithoutHopperExitsOne) {
  if (current_device().is_hopper() && build_info().gpu_kernels) GTEST_SKIP() << "a usable Hopper GPU is present";
  const CliResult r = run_cli("run --backward --device gpu --seqlen 16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(starts_with(r.err, "fa3 run: --device gpu: ")) << r.err;
}

}  // namespace
}  // namespace fa3::test
