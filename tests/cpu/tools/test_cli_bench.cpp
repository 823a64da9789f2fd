// `fa3 bench` on the CPU with a tiny sweep, forward and backward: the table, and JSON
// and CSV files with the documented fields, one record per shape; with a V head dim of
// its own too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "fa3/device.h"
#include "json_reader.h"

namespace fa3::test {
namespace {

const std::vector<std::string> kFields = {"impl",  "pass",   "dtype",  "hdim", "causal", "seqlen",
                                          "batch", "nheads", "tflops", "ms",   "device", "gpu"};

// 2 head dims x 2 causal modes x 2 seqlens; 128 tokens, hidden 128.
const char* const kTinySweep =
    "bench --device cpu --head-dims 32,64 --seqlens 32,64 --tokens 128 --hidden 128 --iters 1 --warmup 0";

// The forward's FLOPs of a record's shape, counted as the FlashAttention papers do:
// 4 x batch x nheads x seqlen^2 x hdim, halved when causal.
double forward_flops(const JsonValue& rec) {
  const double flops = 4 * rec.find("batch")->number * rec.find("nheads")->number * rec.find("seqlen")->number *
                       rec.find("seqlen")->number * rec.find("hdim")->number;
  return rec.find("causal")->boolean ? flops / 2 : flops;
}

// The same with v's head dim of its own: S = QK^T costs 2 x hdim a (query, key) pair,
// O = PV 2 x hdim_v.
double forward_flops_hdim_v(const JsonValue& rec) {
  const double flops = 2 * rec.find("batch")->number * rec.find("nheads")->number * rec.find("seqlen")->number *
                       rec.find("seqlen")->number * (rec.find("hdim")->number + rec.find("hdim_v")->number);
  return rec.find("causal")->boolean ? flops / 2 : flops;
}

// kFields with "hdim_v" after "hdim".
std::vector<std::string> fields_with_hdim_v() {
  std::vector<std::string> fields = kFields;
  fields.insert(std::find(fields.begin(), fields.end(), "hdim") + 1, "hdim_v");
  return fields;
}

std::vector<std::string> keys_of(const JsonValue& rec) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : rec.object) keys.push_back(k);
  return keys;
}

double record_flops(const JsonValue& rec) { return rec.find("tflops")->number * 1e12 * rec.find("ms")->number * 1e-3; }

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream s(text);
  std::string part;
  while (std::getline(s, part, sep)) parts.push_back(part);
  return parts;
}

class CliBench : public ::testing::Test {
 protected:
  void TearDown() override {
    std::remove(json_.c_str());
    std::remove(csv_.c_str());
  }
  std::string json_ = temp_path("bench.json");
  std::string csv_ = temp_path("bench.csv");
};

TEST_F(CliBench, WritesJsonWithTheDocumentedFields) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --json " + json_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value()) << "not valid JSON:\n" << read_file(json_);
  ASSERT_EQ(doc->kind, JsonValue::Kind::kArray);
  ASSERT_EQ(doc->array.size(), 8u);

  std::set<std::string> shapes;
  for (const JsonValue& rec : doc->array) {
    ASSERT_EQ(rec.kind, JsonValue::Kind::kObject);
    std::vector<std::string> keys;
    for (const auto& [k, v] : rec.object) keys.push_back(k);
    EXPECT_EQ(keys, kFields);
    EXPECT_EQ(rec.find("impl")->string, "fa3");
    EXPECT_EQ(rec.find("pass")->string, "fwd");
    EXPECT_EQ(rec.find("dtype")->string, "bf16");
    EXPECT_EQ(rec.find("device")->string, "cpu");
    EXPECT_EQ(rec.find("gpu")->string, "cpu");
    ASSERT_EQ(rec.find("causal")->kind, JsonValue::Kind::kBool);
    const double hdim = rec.find("hdim")->number;
    const double seqlen = rec.find("seqlen")->number;
    EXPECT_EQ(rec.find("batch")->number, 128 / seqlen);   // batch x seqlen = tokens
    EXPECT_EQ(rec.find("nheads")->number, 128 / hdim);    // nheads x hdim = hidden
    EXPECT_GT(rec.find("tflops")->number, 0);
    EXPECT_GT(rec.find("ms")->number, 0);
    EXPECT_NEAR(record_flops(rec), forward_flops(rec), 1e-9 * forward_flops(rec));
    shapes.insert(std::to_string(hdim) + (rec.find("causal")->boolean ? "c" : "n") + std::to_string(seqlen));
  }
  EXPECT_EQ(shapes.size(), 8u) << "every (hdim, causal, seqlen) once";
}

TEST_F(CliBench, WritesCsvMatchingTheJson) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --json " + json_ + " --csv " + csv_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<std::string> lines = split(read_file(csv_), '\n');
  ASSERT_EQ(lines.size(), 9u);
  EXPECT_EQ(lines[0], "impl,pass,dtype,hdim,causal,seqlen,batch,nheads,tflops,ms,device,gpu");
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value());
  ASSERT_EQ(doc->array.size(), 8u);
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], ',');
    ASSERT_EQ(f.size(), kFields.size()) << lines[i];
    const JsonValue& rec = doc->array[i - 1];
    EXPECT_EQ(f[0], "fa3");
    EXPECT_EQ(f[1], "fwd");
    EXPECT_EQ(f[2], "bf16");
    EXPECT_EQ(std::stod(f[3]), rec.find("hdim")->number);
    EXPECT_EQ(f[4], rec.find("causal")->boolean ? "true" : "false");
    EXPECT_EQ(std::stod(f[5]), rec.find("seqlen")->number);
    EXPECT_EQ(std::stod(f[6]), rec.find("batch")->number);
    EXPECT_EQ(std::stod(f[7]), rec.find("nheads")->number);
    EXPECT_EQ(std::stod(f[8]), rec.find("tflops")->number);
    EXPECT_EQ(std::stod(f[9]), rec.find("ms")->number);
    EXPECT_EQ(f[10], "cpu");
    EXPECT_EQ(f[11], "cpu");
  }
}

// Piped output gets the table only: no progress line, no terminal escapes.
TEST_F(CliBench, PrintsTableWithoutProgressWhenPiped) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --causal");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(starts_with(r.out, "fa3 bench: cpu, fa3::cpu::forward (requested); bf16; 4 shapes")) << r.out;
  EXPECT_FALSE(contains(r.out, "\r")) << r.out;
  EXPECT_FALSE(contains(r.out, "\033")) << r.out;
  const std::vector<std::string> lines = split(r.out, '\n');
  ASSERT_EQ(lines.size(), 6u) << r.out;  // heading, column names, 4 rows
  EXPECT_TRUE(contains(lines[1], "hdim") && contains(lines[1], "TFLOP/s")) << lines[1];
  for (std::size_t i = 2; i < lines.size(); ++i) EXPECT_TRUE(contains(lines[i], " yes ")) << lines[i];
  EXPECT_FALSE(contains(lines[1], "hdim_v")) << lines[1];
}

TEST_F(CliBench, NonCausalOnly) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --non-causal --json " + json_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value());
  ASSERT_EQ(doc->array.size(), 4u);
  for (const JsonValue& rec : doc->array) EXPECT_FALSE(rec.find("causal")->boolean);
}

// e4m3 inputs (FP8, bf16 out) time the forward and say so in every record.
TEST_F(CliBench, E4m3IsRecorded) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --dtype e4m3 --json " + json_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value());
  ASSERT_EQ(doc->array.size(), 8u);
  for (const JsonValue& rec : doc->array) {
    EXPECT_EQ(rec.find("dtype")->string, "e4m3");
    EXPECT_EQ(rec.find("pass")->string, "fwd");
    EXPECT_GT(rec.find("tflops")->number, 0);
  }
}

// A shape the library rejects is reported and left out; the files stay valid.
TEST_F(CliBench, RejectedShapeExitsOneAndIsLeftOut) {
  const CliResult r = run_cli("bench --device cpu --head-dims 16,300 --seqlens 16 --tokens 16 --hidden 300 "
                              "--iters 1 --warmup 0 --non-causal --json " + json_ + " --csv " + csv_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.out, "rejected")) << r.out;
  EXPECT_TRUE(contains(r.err, "q: head dim 300 is not supported")) << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value()) << read_file(json_);
  ASSERT_EQ(doc->array.size(), 1u);
  EXPECT_EQ(doc->array[0].find("hdim")->number, 16);
  EXPECT_EQ(split(read_file(csv_), '\n').size(), 2u);
}

// The backward sweep: the same records with "pass": "bwd", 2.5x the forward's FLOPs,
// and "deterministic" last.
TEST_F(CliBench, BackwardWritesBwdRecords) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --backward --json " + json_ + " --csv " + csv_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(starts_with(r.out, "fa3 bench: cpu, fa3::cpu::backward (requested); bf16; 8 shapes")) << r.out;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value()) << "not valid JSON:\n" << read_file(json_);
  ASSERT_EQ(doc->array.size(), 8u);
  std::vector<std::string> fields = kFields;
  fields.push_back("deterministic");
  for (const JsonValue& rec : doc->array) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : rec.object) keys.push_back(k);
    EXPECT_EQ(keys, fields);
    EXPECT_EQ(rec.find("pass")->string, "bwd");
    ASSERT_EQ(rec.find("deterministic")->kind, JsonValue::Kind::kBool);
    EXPECT_FALSE(rec.find("deterministic")->boolean);
    EXPECT_GT(rec.find("ms")->number, 0);
    EXPECT_NEAR(record_flops(rec), 2.5 * forward_flops(rec), 1e-9 * forward_flops(rec));
  }
  const std::vector<std::string> lines = split(read_file(csv_), '\n');
  ASSERT_EQ(lines.size(), 9u);
  EXPECT_EQ(lines[0], "impl,pass,dtype,hdim,causal,seqlen,batch,nheads,tflops,ms,device,gpu,deterministic");
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], ',');
    ASSERT_EQ(f.size(), fields.size()) << lines[i];
    EXPECT_EQ(f[1], "bwd");
    EXPECT_EQ(f[12], "false");
  }
}

TEST_F(CliBench, DeterministicBackwardIsRecorded) {
  const CliResult r =
      run_cli(std::string(kTinySweep) + " --backward --deterministic --causal --seqlens 32 --json " + json_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(starts_with(r.out, "fa3 bench: cpu, fa3::cpu::backward (requested); bf16; deterministic; 2 shapes"))
      << r.out;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value());
  ASSERT_EQ(doc->array.size(), 2u);
  for (const JsonValue& rec : doc->array) EXPECT_TRUE(rec.find("deterministic")->boolean);
}

TEST_F(CliBench, BackwardRejectedShapeExitsOneAndIsLeftOut) {
  const CliResult r = run_cli("bench --backward --device cpu --head-dims 16,300 --seqlens 16 --tokens 16 "
                              "--hidden 300 --iters 1 --warmup 0 --non-causal --json " + json_);
  EXPECT_EQ(r.exit_code, 1);
  // The untimed forward refused it, before the backward was called.
  EXPECT_TRUE(contains(r.err, "fa3 bench: hdim 300 non-causal seqlen 16: fa3::cpu::forward: not supported: q: head "
                              "dim 300 is not supported"))
      << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value()) << read_file(json_);
  ASSERT_EQ(doc->array.size(), 1u);
  EXPECT_EQ(doc->array[0].find("pass")->string, "bwd");
}

// --head-dim-v: every shape's v and out take it, nheads still follow q's and k's head dim,
// and the records carry it after "hdim"; FLOPs count each head dim's GEMM.
TEST_F(CliBench, HeadDimVIsRecordedAndCounted) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --head-dim-v 16 --json " + json_ + " --csv " + csv_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value()) << "not valid JSON:\n" << read_file(json_);
  ASSERT_EQ(doc->array.size(), 8u);
  for (const JsonValue& rec : doc->array) {
    EXPECT_EQ(keys_of(rec), fields_with_hdim_v());
    EXPECT_EQ(rec.find("hdim_v")->number, 16);
    EXPECT_EQ(rec.find("nheads")->number, 128 / rec.find("hdim")->number);
    EXPECT_NEAR(record_flops(rec), forward_flops_hdim_v(rec), 1e-9 * forward_flops_hdim_v(rec));
  }
  const std::vector<std::string> lines = split(read_file(csv_), '\n');
  ASSERT_EQ(lines.size(), 9u);
  EXPECT_EQ(lines[0], "impl,pass,dtype,hdim,hdim_v,causal,seqlen,batch,nheads,tflops,ms,device,gpu");
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], ',');
    ASSERT_EQ(f.size(), kFields.size() + 1) << lines[i];
    EXPECT_EQ(std::stod(f[3]), doc->array[i - 1].find("hdim")->number);
    EXPECT_EQ(f[4], "16");
    EXPECT_EQ(std::stod(f[9]), doc->array[i - 1].find("tflops")->number);
  }
}

// A V head dim equal to the head dim is the plain problem: its FLOPs are the plain
// count, and the record still says what was asked for.
TEST_F(CliBench, HeadDimVEqualToTheHeadDimCountsThePlainFlops) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --head-dims 32 --head-dim-v 32 --json " + json_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value());
  ASSERT_EQ(doc->array.size(), 4u);
  for (const JsonValue& rec : doc->array) {
    EXPECT_EQ(rec.find("hdim_v")->number, 32);
    EXPECT_NEAR(record_flops(rec), forward_flops(rec), 1e-9 * forward_flops(rec));
  }
}

TEST_F(CliBench, HeadDimVShowsInTheTable) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --head-dims 32 --head-dim-v 48 --seqlens 32 --causal");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<std::string> lines = split(r.out, '\n');
  ASSERT_EQ(lines.size(), 3u) << r.out;  // heading, column names, 1 row
  EXPECT_TRUE(starts_with(lines[1], " hdim hdim_v  causal")) << lines[1];
  EXPECT_TRUE(starts_with(lines[2], "   32     48     yes ")) << lines[2];
}

// The CPU backward takes any V head dim: "bwd" records with "hdim_v", 2.5x the forward's
// FLOPs, and "deterministic" last.
TEST_F(CliBench, HeadDimVBackward) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --backward --head-dims 32 --head-dim-v 48 --seqlens 32 "
                              "--json " + json_ + " --csv " + csv_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value()) << read_file(json_);
  ASSERT_EQ(doc->array.size(), 2u);
  std::vector<std::string> fields = fields_with_hdim_v();
  fields.push_back("deterministic");
  for (const JsonValue& rec : doc->array) {
    EXPECT_EQ(keys_of(rec), fields);
    EXPECT_EQ(rec.find("hdim_v")->number, 48);
    EXPECT_NEAR(record_flops(rec), 2.5 * forward_flops_hdim_v(rec), 1e-9 * forward_flops_hdim_v(rec));
  }
  const std::vector<std::string> lines = split(read_file(csv_), '\n');
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "impl,pass,dtype,hdim,hdim_v,causal,seqlen,batch,nheads,tflops,ms,device,gpu,deterministic");
}

// A V head dim past the CPU path's is refused shape by shape; the message names the
// shape with both head dims and, in a backward sweep, the call that refused.
TEST_F(CliBench, HeadDimVPastTheCpuPathIsReportedAndLeftOut) {
  const CliResult fwd = run_cli("bench --device cpu --head-dims 16 --head-dim-v 600 --seqlens 16 --tokens 16 "
                                "--hidden 32 --iters 1 --warmup 0 --non-causal --json " + json_);
  EXPECT_EQ(fwd.exit_code, 1);
  EXPECT_TRUE(contains(fwd.out, "rejected")) << fwd.out;
  EXPECT_EQ(fwd.err,
            "fa3 bench: hdim 16 (v 600) non-causal seqlen 16: not supported: v: head dim 600 is not supported; "
            "supported: 1 to 512\n");
  EXPECT_EQ(read_file(json_), "[]\n");

  const CliResult bwd = run_cli("bench --backward --device cpu --head-dims 16 --head-dim-v 600 --seqlens 16 "
                                "--tokens 16 --hidden 32 --iters 1 --warmup 0 --non-causal");
  EXPECT_EQ(bwd.exit_code, 1);
  EXPECT_EQ(bwd.err,
            "fa3 bench: hdim 16 (v 600) non-causal seqlen 16: fa3::cpu::forward: not supported: v: head dim 600 is "
            "not supported; supported: 1 to 512\n");
}

// The GPU backward takes DeepSeek-V3's (192, 128) on the head dim 192 kernel: one "bwd"
// record with "hdim_v" 128, when the build holds the (192, 128) forward.
TEST_F(CliBench, HeadDimVBackwardOnTheGpu) {
  const BuildInfo& build = build_info();
  const bool built_192 = std::find(build.head_dims.begin(), build.head_dims.end(), 192) != build.head_dims.end();
  if (!current_device().is_hopper() || !built_192) GTEST_SKIP() << "needs a Hopper GPU and head dim 192's kernels";
  const CliResult r = run_cli("bench --backward --device gpu --head-dims 192 --head-dim-v 128 --seqlens 128 "
                              "--tokens 256 --hidden 384 --iters 1 --warmup 0 --non-causal --json " + json_);
  if (r.exit_code != 0 && contains(r.err, "fa3::forward: not supported: no forward kernel was built")) {
    GTEST_SKIP() << "the (192, 128) forward is not in this build";
  }
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value()) << read_file(json_);
  ASSERT_EQ(doc->array.size(), 1u);
  EXPECT_EQ(doc->array[0].find("hdim_v")->number, 128);
  EXPECT_EQ(doc->array[0].find("pass")->string, "bwd");
}

// --flush-l2 on the GPU: the calls are timed after a flush, and the files say so ("timing"
// after "gpu" in the JSON, a column of its own in the CSV).
TEST_F(CliBench, FlushedGpuTimingIsRecorded) {
  const BuildInfo& build = build_info();
  const bool built_128 = std::find(build.head_dims.begin(), build.head_dims.end(), 128) != build.head_dims.end();
  if (!current_device().is_hopper() || !built_128) GTEST_SKIP() << "needs a Hopper GPU and head dim 128's kernels";
  const CliResult r = run_cli("bench --device gpu --head-dims 128 --seqlens 256 --tokens 512 --hidden 256 --iters 2 "
                              "--warmup 0 --non-causal --flush-l2 --json " + json_ + " --csv " + csv_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value()) << read_file(json_);
  ASSERT_EQ(doc->array.size(), 1u);
  const JsonValue& rec = doc->array[0];
  std::vector<std::string> keys;
  for (const auto& [k, v] : rec.object) keys.push_back(k);
  std::vector<std::string> expected = kFields;
  expected.push_back("timing");
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(rec.find("timing")->string, "l2-flushed");
  EXPECT_GT(rec.find("tflops")->number, 0);
  const std::vector<std::string> lines = split(read_file(csv_), '\n');
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "impl,pass,dtype,hdim,causal,seqlen,batch,nheads,tflops,ms,device,gpu,timing");
  EXPECT_EQ(split(lines[1], ',').back(), "l2-flushed");
}

TEST_F(CliBench, UnwritableFileExitsOne) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --seqlens 32 --head-dims 32 --json /nonexistent-dir/x.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "cannot open '/nonexistent-dir/x.json'")) << r.err;
}

}  // namespace
}  // namespace fa3::test
