// The tuning cache's text format: what is written reads back the same, and anything but
// a whole file of this version written for the key is refused, saying why.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "api/tune_format.h"
#include "tune_test_util.h"

namespace fa3::test {
namespace {

std::vector<TuneEntry> sample_entries() {
  std::vector<TuneEntry> entries = {test_entry(512), test_entry(1024, "128x128", true), test_entry(16384)};
  entries[1].cls.dtype = DType::kFloat16;
  entries[1].cls.gqa = 8;
  entries[1].cls.seqlen_q = 1;
  entries[2].kernel_ms = 1.0 / 3.0;  // needs every digit to read back the same
  return entries;
}

std::string sample_text() { return format_tune_cache(test_key(), sample_entries()); }

// `text` with the first occurrence of `from` replaced by `to`.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

// Parsing `text` fails, and the message holds `part`.
void expect_refused(const std::string& text, const std::string& part) {
  std::vector<TuneEntry> entries = {test_entry(2)};
  const Status s = parse_tune_cache(text, test_key(), &entries);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
  EXPECT_NE(s.message().find(part), std::string::npos) << "message: " << s.message() << "\nexpected: " << part;
  EXPECT_EQ(entries.size(), 1u) << "a refused file leaves the output alone";
}

TEST(TuneFormat, WritesTheDocumentedLayout) {
  const std::string text = format_tune_cache(test_key(), {test_entry(1024)});
  EXPECT_EQ(text,
            "fa3 tune cache\t1\n"
            "gpu\tNVIDIA H200\n"
            "sm_count\t132\n"
            "cuda_driver\t13000\n"
            "fa3\t0.1.0\n"
            "# direction dtype head_dim mask seqlen_q seqlen_k gqa kernel kernel_ms heuristic heuristic_ms\n"
            "fwd\tbf16\t128\tplain\t1024\t1024\t1\t128x128-c2\t0.5\t128x128\t0.625\n"
            "end\t1\n");
}

TEST(TuneFormat, RoundTrips) {
  std::vector<TuneEntry> read;
  ASSERT_TRUE(parse_tune_cache(sample_text(), test_key(), &read).is_ok());
  EXPECT_TRUE(same_entries(read, sample_entries()));
}

TEST(TuneFormat, EmptyCacheRoundTrips) {
  std::vector<TuneEntry> read = {test_entry(2)};
  ASSERT_TRUE(parse_tune_cache(format_tune_cache(test_key(), {}), test_key(), &read).is_ok());
  EXPECT_TRUE(read.empty());
}

TEST(TuneFormat, CommentLinesAreSkipped) {
  const std::string text = replaced(sample_text(), "end\t", "# a note\n#\nend\t");
  std::vector<TuneEntry> read;
  ASSERT_TRUE(parse_tune_cache(text, test_key(), &read).is_ok());
  EXPECT_EQ(read.size(), 3u);
}

// A file cut at any byte is refused: the end line counts the entries and every line
// ends with a line break.
TEST(TuneFormat, EveryTruncationIsRefused) {
  const std::string text = sample_text();
  for (std::size_t n = 0; n < text.size(); ++n) {
    std::vector<TuneEntry> read;
    EXPECT_FALSE(parse_tune_cache(text.substr(0, n), test_key(), &read).is_ok()) << "cut after " << n << " bytes";
  }
}

TEST(TuneFormat, TruncationsSayWhy) {
  const std::string text = sample_text();
  expect_refused("", "the file is empty");
  expect_refused(text.substr(0, text.size() - 1), "truncated: the last line has no line break");
  expect_refused(text.substr(0, text.find("end\t")), "truncated: no end line after 3 entries");
  expect_refused(text.substr(0, text.find("sm_count")), "truncated: the key is incomplete");
  // Whole lines lost between entries: the count tells.
  const std::size_t second = text.find("fwd\tfp16");
  const std::size_t third = text.find('\n', second) + 1;
  expect_refused(text.substr(0, second) + text.substr(third), "the end line counts 3 entries, the file holds 2");
}

TEST(TuneFormat, ForeignFilesAreRefused) {
  expect_refused("{\"not\": \"a cache\"}\n", "line 1: not an fa3 tuning cache");
  expect_refused(replaced(sample_text(), "fa3 tune cache\t1", "fa3 tune cache\t2"),
                 "line 1: format version 2; this fa3 reads version 1");
  expect_refused(replaced(sample_text(), "fa3 tune cache\t1", "fa3 tune cache\tone"),
                 "expected 'fa3 tune cache<TAB>version'");
}

TEST(TuneFormat, OtherKeysAreRefused) {
  const std::string base = "not for this GPU and build (NVIDIA H200, 132 SMs, CUDA driver 13.0, fa3 0.1.0)";
  expect_refused(replaced(sample_text(), "NVIDIA H200", "NVIDIA H100 80GB HBM3"),
                 "written for NVIDIA H100 80GB HBM3, 132 SMs, CUDA driver 13.0, fa3 0.1.0, " + base);
  expect_refused(replaced(sample_text(), "sm_count\t132", "sm_count\t114"), "written for NVIDIA H200, 114 SMs");
  expect_refused(replaced(sample_text(), "cuda_driver\t13000", "cuda_driver\t12080"), "CUDA driver 12.8");
  expect_refused(replaced(sample_text(), "fa3\t0.1.0", "fa3\t0.0.9"), "fa3 0.0.9, " + base);
}

TEST(TuneFormat, MalformedKeyLinesAreRefused) {
  expect_refused(replaced(sample_text(), "gpu\t", "name\t"), "line 2: expected 'gpu<TAB>value'");
  expect_refused(replaced(sample_text(), "sm_count\t132", "sm_count\t132\textra"), "line 3: expected 'sm_count");
  expect_refused(replaced(sample_text(), "sm_count\t132", "sm_count\t13x"),
                 "sm_count and cuda_driver must be integers");
  expect_refused(replaced(sample_text(), "sm_count\t132", "sm_count\t99999999999"), "the key is malformed");
}

TEST(TuneFormat, CorruptEntriesAreRefused) {
  const std::string text = sample_text();
  const std::string line = "fwd\tbf16\t128\tplain\t512\t512\t1\t128x128-c2\t0.25\t128x128\t0.3125";
  ASSERT_NE(text.find(line), std::string::npos) << text;
  const std::pair<std::string, std::string> cases[] = {
      {"fwd\tbf16\t128\tplain\t512\t512\t1\t128x128-c2\t0.25\t128x128",
       "line 7: expected 11 tab-separated fields, got 10"},
      {"bwd\tbf16\t128\tplain\t512\t512\t1\t128x128-c2\t0.25\t128x128\t0.3125", "unknown direction 'bwd'"},
      {"fwd\tbf17\t128\tplain\t512\t512\t1\t128x128-c2\t0.25\t128x128\t0.3125", "unknown dtype 'bf17'"},
      {"fwd\tbf16\t512\tplain\t512\t512\t1\t128x128-c2\t0.25\t128x128\t0.3125",
       "head_dim '512' is not an integer from 1 to 256"},
      {"fwd\tbf16\t128\tlocal\t512\t512\t1\t128x128-c2\t0.25\t128x128\t0.3125",
       "mask 'local' is neither plain nor causal"},
      {"fwd\tbf16\t128\tplain\t500\t512\t1\t128x128-c2\t0.25\t128x128\t0.3125", "cls.seqlen_q: 500 is not a bucket"},
      {"fwd\tbf16\t128\tplain\t512\t 512\t1\t128x128-c2\t0.25\t128x128\t0.3125", "must be integers"},
      {"fwd\tbf16\t128\tplain\t512\t512\t0\t128x128-c2\t0.25\t128x128\t0.3125", "cls.gqa: 0 is not a bucket"},
      {"fwd\tbf16\t128\tplain\t512\t512\t1\t\t0.25\t128x128\t0.3125", "kernel: '' is not a kernel name"},
      {"fwd\tbf16\t128\tplain\t512\t512\t1\t128 x128\t0.25\t128x128\t0.3125",
       "kernel: '128 x128' is not a kernel name"},
      {"fwd\tbf16\t128\tplain\t512\t512\t1\t128x128-c2\tfast\t128x128\t0.3125",
       "kernel_ms and heuristic_ms must be numbers"},
      {"fwd\tbf16\t128\tplain\t512\t512\t1\t128x128-c2\t-1\t128x128\t0.3125",
       "kernel_ms: must be finite and > 0, got -1"},
      {"fwd\tbf16\t128\tplain\t512\t512\t1\t128x128-c2\t0.25\t128x128\tinf", "heuristic_ms: must be finite and > 0"},
  };
  for (const auto& [bad, why] : cases) expect_refused(replaced(text, line, bad), why);
  expect_refused(replaced(text, line, line + "\n" + line), "line 8: a second entry for fwd bf16 hdim128 plain q<=512");
  expect_refused(text + "fwd\n", "line 11: text after the end line");
  expect_refused(replaced(text, "end\t3", "end\tthree"), "expected 'end<TAB>entry count'");
  expect_refused(replaced(text, "\nend", "\r\nend"), "line 9: kernel_ms and heuristic_ms must be numbers");
}

TEST(TuneFormat, ContentsCheckNamesTheField) {
  const auto check = [](const TuneKey& key, const std::vector<TuneEntry>& entries) {
    return check_tune_contents(key, entries).message();
  };
  EXPECT_EQ(check(test_key(), sample_entries()), "");
  TuneKey key = test_key();
  key.gpu_name = "two\tfields";
  EXPECT_EQ(check(key, {}), "key.gpu_name: 'two\tfields' is empty or holds a tab or line break");
  key = test_key();
  key.fa3_version = "";
  EXPECT_EQ(check(key, {}), "key.fa3_version: '' is empty or holds a tab or line break");
  key = test_key();
  key.sm_count = 0;
  EXPECT_EQ(check(key, {}), "key.sm_count: must be >= 1, got 0");

  std::vector<TuneEntry> entries = sample_entries();
  entries[2].kernel = "a\nb";
  EXPECT_EQ(check(test_key(), entries),
            "entries[2].kernel: 'a\nb' is not a kernel name (empty, or holds a space, tab or line break)");
  entries = sample_entries();
  entries[1].heuristic_ms = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(check(test_key(), entries), "entries[1].heuristic_ms: must be finite and > 0, got nan");
  entries = sample_entries();
  entries[0].cls.head_dim = 0;
  EXPECT_EQ(check(test_key(), entries), "entries[0].cls.head_dim: 0 is outside 1 to 256");
  entries = sample_entries();
  entries[0].cls.seqlen_k = 3;
  EXPECT_EQ(check(test_key(), entries), "entries[0].cls.seqlen_k: 3 is not a bucket (a power of two from 1 to 2^31)");
}

}  // namespace
}  // namespace fa3::test
