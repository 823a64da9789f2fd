// `fa3` command lines that are wrong, and requests for help: wrong ones exit 2 with a
// one-line error and the usage on stderr (never a crash); help exits 0 with the usage
// on stdout.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "cli_runner.h"

namespace fa3::test {
namespace {

struct BadArgs {
  std::string name;
  std::string args;
  std::string error;  // a part of the error line
};

void PrintTo(const BadArgs& b, std::ostream* os) { *os << "fa3 " << b.args; }

std::vector<BadArgs> bad_args() {
  return {
      {"no_command", "", "no command given"},
      {"unknown_command", "frobnicate", "unknown command 'frobnicate'"},
      {"unknown_flag", "run --frobnicate 3", "unknown option '--frobnicate'"},
      {"info_takes_no_flags", "info --batch 2", "unknown option '--batch'"},
      {"positional_argument", "run 512", "unexpected argument '512'"},
      {"missing_value_at_end", "run --batch", "--batch needs a value"},
      {"missing_value_before_flag", "run --seqlen --causal", "--seqlen needs a value"},
      {"non_numeric", "run --batch two", "--batch: expected an integer, got 'two'"},
      {"trailing_junk", "run --nheads 8x", "--nheads: expected an integer, got '8x'"},
      {"zero_size", "run --seqlen 0", "--seqlen: 0 is out of range (1 to 2147483647)"},
      {"negative_size", "run --head-dim -64", "--head-dim: -64 is out of range"},
      {"zero_head_dim_v", "run --head-dim-v 0", "--head-dim-v: 0 is out of range (1 to 2147483647)"},
      {"size_over_int32", "run --seqlen-k 2147483648", "--seqlen-k: 2147483648 is out of range"},
      {"zero_iters", "run --iters 0", "--iters: 0 is out of range"},
      {"bad_dtype", "run --dtype fp8", "--dtype: expected bf16, fp16, fp32 or e4m3, got 'fp8'"},
      {"e4m3_backward", "run --dtype e4m3 --backward",
       "--dtype e4m3 runs the forward pass only (FP8 has no backward); drop --backward"},
      {"bench_e4m3_backward", "bench --backward --dtype e4m3",
       "--dtype e4m3 runs the forward pass only (FP8 has no backward); drop --backward"},
      {"bad_device", "run --device tpu", "--device: expected auto, gpu or cpu, got 'tpu'"},
      {"window_one_side", "run --window 128", "--window: expected LEFT,RIGHT"},
      {"window_below_minus_one", "run --window -2,0", "--window: -2 is out of range"},
      {"scale_negative", "run --scale -1", "--scale: expected a finite number >= 0, got '-1'"},
      {"softcap_nan", "run --softcap nan", "--softcap: expected a finite number >= 0, got 'nan'"},
      {"sinks_not_a_number", "run --sinks 1,x", "--sinks: expected a finite number or a comma-separated list"},
      {"sinks_infinite", "run --sinks inf", "--sinks: expected a finite number"},
      {"sinks_count", "run --nheads 4 --sinks 1,2,3", "--sinks: 3 values for 4 heads"},
      {"switch_with_value", "run --causal=yes", "--causal takes no value"},
      {"heads_not_divisible", "run --nheads 6 --nheads-kv 4", "--nheads-kv 4 must divide --nheads 6"},
      {"causal_with_right_window", "run --causal --window 8,2", "conflicts with --causal"},
      {"fp32_on_gpu", "run --dtype fp32 --device gpu", "--dtype fp32 runs on the CPU only"},
      {"bench_bad_list", "bench --seqlens 512,,1024", "--seqlens: expected an integer, got ''"},
      {"bench_missing_json", "bench --json", "--json needs a value"},
      {"bench_empty_csv", "bench --csv=", "--csv needs a file name"},
      {"bench_fp32_on_gpu", "bench --device gpu --dtype fp32", "--dtype fp32 runs on the CPU only"},
      {"bench_zero_head_dim_v", "bench --head-dim-v 0", "--head-dim-v: 0 is out of range (1 to 2147483647)"},
      {"bench_negative_head_dim_v", "bench --head-dim-v -128", "--head-dim-v: -128 is out of range"},
      {"bench_head_dim_v_over_int32", "bench --head-dim-v 2147483648", "--head-dim-v: 2147483648 is out of range"},
      {"bench_head_dim_v_list", "bench --head-dim-v 128,64", "--head-dim-v: expected an integer, got '128,64'"},
      {"bench_head_dim_v_missing", "bench --head-dim-v", "--head-dim-v needs a value"},
      {"kernel_empty", "run --kernel=", "--kernel needs a kernel name"},
      {"kernel_on_cpu", "run --device cpu --kernel 128x128", "--kernel names a GPU kernel"},
      {"bench_kernel_on_cpu", "bench --device cpu --kernel 128x128", "--kernel names a GPU kernel"},
      {"flush_on_cpu", "run --device cpu --flush-l2", "--flush-l2 flushes the GPU's L2 cache"},
      {"bench_flush_on_cpu", "bench --device cpu --flush-l2", "--flush-l2 flushes the GPU's L2 cache"},
      {"flush_with_value", "bench --flush-l2=yes", "--flush-l2 takes no value"},
      {"deterministic_without_backward", "run --deterministic", "--deterministic applies to the backward pass"},
      {"bench_deterministic_without_backward", "bench --deterministic --seqlens 64",
       "--deterministic applies to the backward pass; add --backward"},
      {"backward_with_value", "run --backward=1", "--backward takes no value"},
      {"backward_bad_size", "run --backward --seqlen 0", "--seqlen: 0 is out of range"},
      {"bench_backward_fp32_on_gpu", "bench --backward --device gpu --dtype fp32", "--dtype fp32 runs on the CPU only"},
  };
}

class CliBadArgs : public ::testing::TestWithParam<BadArgs> {};

TEST_P(CliBadArgs, ExitsTwoWithErrorAndUsage) {
  const BadArgs& b = GetParam();
  const CliResult r = run_cli(b.args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  const std::string first_line = r.err.substr(0, r.err.find('\n'));
  EXPECT_TRUE(starts_with(first_line, "fa3")) << first_line;
  EXPECT_TRUE(contains(first_line, "error: ")) << first_line;
  EXPECT_TRUE(contains(first_line, b.error)) << first_line << "\nexpected: " << b.error;
  EXPECT_TRUE(contains(r.err, "\nusage: fa3")) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Cli, CliBadArgs, ::testing::ValuesIn(bad_args()),
                         [](const auto& info) { return info.param.name; });

// Each command's usage goes with its errors, so the user sees the options that exist.
TEST(CliBadArgs, ErrorShowsTheCommandsUsage) {
  EXPECT_TRUE(contains(run_cli("run --frob").err, "usage: fa3 run"));
  EXPECT_TRUE(contains(run_cli("bench --frob").err, "usage: fa3 bench"));
  EXPECT_TRUE(contains(run_cli("info --frob").err, "usage: fa3 info"));
  EXPECT_TRUE(contains(run_cli("frob").err, "usage: fa3 <command>"));
}

struct HelpArgs {
  std::string name;
  std::string args;
  std::string usage;  // how the usage text starts
};

void PrintTo(const HelpArgs& h, std::ostream* os) { *os << "fa3 " << h.args; }

class CliHelp : public ::testing::TestWithParam<HelpArgs> {};

TEST_P(CliHelp, PrintsUsageAndExitsZero) {
  const HelpArgs& h = GetParam();
  const CliResult r = run_cli(h.args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(starts_with(r.out, h.usage)) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Cli, CliHelp,
                         ::testing::Values(HelpArgs{"long", "--help", "usage: fa3 <command>"},
                                           HelpArgs{"short", "-h", "usage: fa3 <command>"},
                                           HelpArgs{"word", "help", "usage: fa3 <command>"},
                                           HelpArgs{"info", "info --help", "usage: fa3 info"},
                                           HelpArgs{"run", "run --help", "usage: fa3 run"},
                                           HelpArgs{"bench", "bench -h", "usage: fa3 bench"},
                                           HelpArgs{"wins_over_bad_flags", "run --batch 0 --frob --help",
                                                    "usage: fa3 run"}),
                         [](const auto& info) { return info.param.name; });

TEST(CliHelp, DocumentsEveryRunAndBenchOption) {
  const std::string run = run_cli("run --help").out;
  for (const char* flag : {"--batch", "--seqlen ", "--seqlen-q", "--seqlen-k", "--nheads ", "--nheads-kv",
                           "--head-dim", "--dtype", "--causal", "--window", "--softcap", "--scale", "--device",
                           "--iters", "--warmup", "--threads", "--check-rows", "--seed", "--backward",
                           "--deterministic", "--sinks", "--kernel", "--flush-l2"}) {
    EXPECT_TRUE(contains(run, flag)) << flag;
  }
  const std::string bench = run_cli("bench --help").out;
  for (const char* flag : {"--head-dims", "--head-dim-v", "--seqlens", "--causal", "--non-causal", "--tokens",
                           "--hidden", "--dtype", "--device", "--iters", "--warmup", "--json", "--csv", "--backward",
                           "--deterministic", "--kernel", "--flush-l2"}) {
    EXPECT_TRUE(contains(bench, flag)) << flag;
  }
  EXPECT_TRUE(contains(bench, "default sweep on the CPU"));
  EXPECT_TRUE(contains(bench, "\"pass\": \"fwd\" | \"bwd\""));
  EXPECT_TRUE(contains(bench, "\"hdim_v\" after \"hdim\" when --head-dim-v is given"));
  EXPECT_TRUE(contains(run_cli("--help").out, "--backward"));
}

}  // namespace
}  // namespace fa3::test
