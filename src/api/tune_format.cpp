#include "api/tune_format.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <set>
#include <string_view>

#include "api/tune_class.h"

namespace fa3 {
namespace {

constexpr std::string_view kMagic = "fa3 tune cache";
constexpr char kColumns[] =
    "# direction dtype head_dim mask seqlen_q seqlen_k gqa kernel kernel_ms heuristic heuristic_ms\n";
constexpr std::size_t kEntryFields = 11;
// The library's largest head dim.
constexpr int kMaxHeadDim = 256;

Status invalid(const std::string& msg) { return {StatusCode::kInvalidArgument, msg}; }

// A key field or a kernel name: one field of one line, readable in a table.
bool is_name(const std::string& s, bool spaces_allowed) {
  if (s.empty()) return false;
  for (unsigned char ch : s) {
    if (ch < 0x20 || ch == 0x7f || (ch == ' ' && !spaces_allowed)) return false;
  }
  return true;
}

// Shortest text that reads back to the same double.
std::string number_text(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

// Whole-field parses: no spaces, no signs but '-', nothing after the number.
bool parse_number(std::string_view text, std::int64_t* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return !text.empty() && ec == std::errc() && ptr == end;
}

bool parse_number(std::string_view text, double* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return !text.empty() && ec == std::errc() && ptr == end;
}

bool parse_dtype(std::string_view text, DType* dtype) {
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat32}) {
    if (text == dtype_name(d)) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

std::vector<std::string_view> split_tabs(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t tab = line.find('\t', start);
    fields.push_back(line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start));
    if (tab == std::string_view::npos) return fields;
    start = tab + 1;
  }
}

// "" when a kernel name (field `field`) can be written, else what is wrong.
std::string kernel_name_problem(const char* field, const std::string& name) {
  if (is_name(name, false)) return "";
  return std::string(field) + ": '" + name + "' is not a kernel name (empty, or holds a space, tab or line break)";
}

std::string time_problem(const char* field, double ms) {
  if (std::isfinite(ms) && ms > 0) return "";
  return std::string(field) + ": must be finite and > 0, got " + number_text(ms);
}

// "" when `e` can be written, else what is wrong, after the field's name.
std::string entry_problem(const TuneEntry& e) {
  const TuneClass& c = e.cls;
  if (c.head_dim < 1 || c.head_dim > kMaxHeadDim) {
    return "cls.head_dim: " + std::to_string(c.head_dim) + " is outside 1 to " + std::to_string(kMaxHeadDim);
  }
  const std::pair<const char*, std::int64_t> buckets[] = {
      {"cls.seqlen_q", c.seqlen_q}, {"cls.seqlen_k", c.seqlen_k}, {"cls.gqa", c.gqa}};
  for (const auto& [name, value] : buckets) {
    if (!is_tune_bucket(value)) {
      return std::string(name) + ": " + std::to_string(value) + " is not a bucket (a power of two from 1 to 2^31)";
    }
  }
  for (const std::string& problem :
       {kernel_name_problem("kernel", e.kernel), time_problem("kernel_ms", e.kernel_ms),
        kernel_name_problem("heuristic", e.heuristic), time_problem("heuristic_ms", e.heuristic_ms)}) {
    if (!problem.empty()) return problem;
  }
  return "";
}

std::string key_problem(const TuneKey& key) {
  if (!is_name(key.gpu_name, true)) return "gpu_name: '" + key.gpu_name + "' is empty or holds a tab or line break";
  if (!is_name(key.fa3_version, true)) {
    return "fa3_version: '" + key.fa3_version + "' is empty or holds a tab or line break";
  }
  if (key.sm_count < 1) return "sm_count: must be >= 1, got " + std::to_string(key.sm_count);
  if (key.cuda_driver < 0) return "cuda_driver: must be >= 0, got " + std::to_string(key.cuda_driver);
  return "";
}

// One entry line's fields, already split.
std::string parse_entry(const std::vector<std::string_view>& f, TuneEntry* e) {
  if (f.size() != kEntryFields) {
    return "expected " + std::to_string(kEntryFields) + " tab-separated fields, got " + std::to_string(f.size());
  }
  if (f[0] != tune_direction_name(TuneDirection::kForward)) return "unknown direction '" + std::string(f[0]) + "'";
  if (!parse_dtype(f[1], &e->cls.dtype)) return "unknown dtype '" + std::string(f[1]) + "'";
  std::int64_t head_dim = 0;
  if (!parse_number(f[2], &head_dim) || head_dim < 1 || head_dim > kMaxHeadDim) {
    return "head_dim '" + std::string(f[2]) + "' is not an integer from 1 to " + std::to_string(kMaxHeadDim);
  }
  e->cls.head_dim = static_cast<int>(head_dim);
  if (f[3] != "plain" && f[3] != "causal") return "mask '" + std::string(f[3]) + "' is neither plain nor causal";
  e->cls.causal = f[3] == "causal";
  if (!parse_number(f[4], &e->cls.seqlen_q) || !parse_number(f[5], &e->cls.seqlen_k) ||
      !parse_number(f[6], &e->cls.gqa)) {
    return "seqlen_q, seqlen_k and gqa must be integers";
  }
  e->kernel = f[7];
  e->heuristic = f[9];
  if (!parse_number(f[8], &e->kernel_ms) || !parse_number(f[10], &e->heuristic_ms)) {
    return "kernel_ms and heuristic_ms must be numbers";
  }
  return entry_problem(*e);
}

// Reads "name<TAB>value" into `value`; "" or what is wrong.
std::string parse_key_line(std::string_view line, std::string_view name, std::string* value) {
  const std::vector<std::string_view> f = split_tabs(line);
  if (f.size() != 2 || f[0] != name) return "expected '" + std::string(name) + "<TAB>value'";
  *value = f[1];
  return "";
}

}  // namespace

Status check_tune_contents(const TuneKey& key, const std::vector<TuneEntry>& entries) {
  const std::string bad_key = key_problem(key);
  if (!bad_key.empty()) return invalid("key." + bad_key);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string bad = entry_problem(entries[i]);
    if (!bad.empty()) return invalid("entries[" + std::to_string(i) + "]." + bad);
  }
  return Status::ok();
}

std::string format_tune_cache(const TuneKey& key, const std::vector<TuneEntry>& entries) {
  std::string s = std::string(kMagic) + "\t" + std::to_string(kTuneFormatVersion) + "\n";
  s += "gpu\t" + key.gpu_name + "\n";
  s += "sm_count\t" + std::to_string(key.sm_count) + "\n";
  s += "cuda_driver\t" + std::to_string(key.cuda_driver) + "\n";
  s += "fa3\t" + key.fa3_version + "\n";
  s += kColumns;
  for (const TuneEntry& e : entries) {
    const TuneClass& c = e.cls;
    s += std::string(tune_direction_name(c.direction)) + "\t" + dtype_name(c.dtype) + "\t" +
         std::to_string(c.head_dim) + "\t" + (c.causal ? "causal" : "plain") + "\t" + std::to_string(c.seqlen_q) +
         "\t" + std::to_string(c.seqlen_k) + "\t" + std::to_string(c.gqa) + "\t" + e.kernel + "\t" +
         number_text(e.kernel_ms) + "\t" + e.heuristic + "\t" + number_text(e.heuristic_ms) + "\n";
  }
  s += "end\t" + std::to_string(entries.size()) + "\n";
  return s;
}

Status parse_tune_cache(const std::string& text, const TuneKey& key, std::vector<TuneEntry>* entries) {
  if (text.empty()) return invalid("the file is empty");
  if (text.back() != '\n') return invalid("truncated: the last line has no line break");
  std::vector<std::string_view> lines;
  const std::string_view all(text);
  for (std::size_t start = 0; start < all.size();) {
    const std::size_t end = all.find('\n', start);
    lines.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  auto at = [](std::size_t index, const std::string& msg) {
    return invalid("line " + std::to_string(index + 1) + ": " + msg);
  };

  const std::vector<std::string_view> magic = split_tabs(lines[0]);
  if (magic[0] != kMagic) return at(0, "not an fa3 tuning cache");
  std::int64_t version = 0;
  if (magic.size() != 2 || !parse_number(magic[1], &version)) return at(0, "expected 'fa3 tune cache<TAB>version'");
  if (version != kTuneFormatVersion) {
    return at(0, "format version " + std::to_string(version) + "; this fa3 reads version " +
                     std::to_string(kTuneFormatVersion));
  }

  constexpr std::size_t kKeyLines = 4;
  if (lines.size() < 1 + kKeyLines) return invalid("truncated: the key is incomplete");
  TuneKey file_key;
  std::string sm_count, cuda_driver;
  const std::pair<std::string_view, std::string*> key_lines[kKeyLines] = {{"gpu", &file_key.gpu_name},
                                                                          {"sm_count", &sm_count},
                                                                          {"cuda_driver", &cuda_driver},
                                                                          {"fa3", &file_key.fa3_version}};
  for (std::size_t i = 0; i < kKeyLines; ++i) {
    const std::string bad = parse_key_line(lines[1 + i], key_lines[i].first, key_lines[i].second);
    if (!bad.empty()) return at(1 + i, bad);
  }
  std::int64_t sms = 0, driver = 0;
  if (!parse_number(sm_count, &sms) || !parse_number(cuda_driver, &driver)) {
    return at(2, "sm_count and cuda_driver must be integers");
  }
  file_key.sm_count = static_cast<int>(sms);
  file_key.cuda_driver = static_cast<int>(driver);
  if (sms != file_key.sm_count || driver != file_key.cuda_driver || !key_problem(file_key).empty()) {
    return at(1, "the key is malformed");
  }
  if (file_key != key) {
    return invalid("written for " + file_key.describe() + ", not for this GPU and build (" + key.describe() + ")");
  }

  std::vector<TuneEntry> read;
  std::set<TuneClass> seen;
  for (std::size_t i = 1 + kKeyLines; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    if (line.starts_with('#')) continue;
    const std::vector<std::string_view> f = split_tabs(line);
    if (f[0] == "end") {
      std::int64_t count = -1;
      if (f.size() != 2 || !parse_number(f[1], &count)) return at(i, "expected 'end<TAB>entry count'");
      if (count != static_cast<std::int64_t>(read.size())) {
        return at(i, "the end line counts " + std::to_string(count) + " entries, the file holds " +
                         std::to_string(read.size()));
      }
      if (i + 1 != lines.size()) return at(i + 1, "text after the end line");
      *entries = std::move(read);
      return Status::ok();
    }
    TuneEntry e;
    const std::string bad = parse_entry(f, &e);
    if (!bad.empty()) return at(i, bad);
    if (!seen.insert(e.cls).second) return at(i, "a second entry for " + e.cls.describe());
    read.push_back(std::move(e));
  }
  return invalid("truncated: no end line after " + std::to_string(read.size()) + " entries");
}

}  // namespace fa3
