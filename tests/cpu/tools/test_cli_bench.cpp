// `fa3 bench` on the CPU with a tiny sweep, forward and backward: the table, and JSON
// and CSV files with the documented fields, one record per shape.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "json_reader.h"

namespace fa3::test {
namespace {

const std::vector<std::string> kFields = {"impl",  "pass",   "dtype",  "hdim", "causal", "seqlen",
                                          "batch", "nheads", "tflops", "ms",   "device", "gpu"};

// 2 head dims x 2 causal modes x 2 seqlens; 128 tokens, hidden 128.
const char* const kTinySweep =
    "bench --device cpu --head-dims 32,64 --seqlens 32,64 --tokens 128 --hidden 128 --iters 1 --warmup 0";

// The forward's FLOPs of a record's shape, counted as the FlashAttention papers do.
double forward_flops(const JsonValue& rec) {
  const double flops = 4 * rec.find("batch")->number * rec.find("nheads")->number * rec.find("seqlen")->number *
                       rec.find("seqlen")->number * rec.find("hdim")->number;
  return rec.find("causal")->boolean ? flops / 2 : flops;
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
}

TEST_F(CliBench, NonCausalOnly) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --non-causal --json " + json_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value());
  ASSERT_EQ(doc->array.size(), 4u);
  for (const JsonValue& rec : doc->array) EXPECT_FALSE(rec.find("causal")->boolean);
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
  EXPECT_TRUE(contains(r.err, "q: head dim 300 is not supported")) << r.err;
  const auto doc = parse_json(read_file(json_));
  ASSERT_TRUE(doc.has_value()) << read_file(json_);
  ASSERT_EQ(doc->array.size(), 1u);
  EXPECT_EQ(doc->array[0].find("pass")->string, "bwd");
}

TEST_F(CliBench, UnwritableFileExitsOne) {
  const CliResult r = run_cli(std::string(kTinySweep) + " --seqlens 32 --head-dims 32 --json /nonexistent-dir/x.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "cannot open '/nonexistent-dir/x.json'")) << r.err;
}

}  // namespace
}  // namespace fa3::test
