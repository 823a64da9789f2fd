#include "tune_report.h"

#include <algorithm>
#include <cstdio>

#include "format.h"

namespace fa3::cli {
namespace {

// The widest label, so that the columns after it line up.
int label_width(const std::vector<std::string>& labels) {
  std::size_t width = 5;
  for (const std::string& l : labels) width = std::max(width, l.size());
  return static_cast<int>(width);
}

std::string label_column(int width, const std::string& label) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-*s", width, label.c_str());
  return buf;
}

std::string count_column(const std::string& count) {
  char buf[32];
  std::snprintf(buf, sizeof buf, " %7s", count.c_str());
  return buf;
}

// The columns both tables end with: the fastest kernel, the built-in choice, the speedup.
std::string choice_columns(const std::string& fastest, const std::string& fastest_ms, const std::string& heuristic,
                           const std::string& heuristic_ms, const std::string& speedup) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-14s %9s  %-14s %9s %8s\n", fastest.c_str(), fastest_ms.c_str(), heuristic.c_str(),
                heuristic_ms.c_str(), speedup.c_str());
  return buf;
}

std::string choice_columns(const TuneEntry& e) {
  return choice_columns(e.kernel, fixed(e.kernel_ms, 4), e.heuristic, fixed(e.heuristic_ms, 4),
                        fixed(e.heuristic_ms / e.kernel_ms, 3) + "x");
}

}  // namespace

std::string tune_table(const std::vector<TuneRow>& rows) {
  std::vector<std::string> labels;
  for (const TuneRow& r : rows) labels.push_back(r.label);
  const int width = label_width(labels);
  std::string s = label_column(width, "class") + count_column("kernels") +
                  choice_columns("fastest", "ms", "built-in", "ms", "speedup");
  for (const TuneRow& r : rows) {
    s += label_column(width, r.label);
    if (r.error.empty()) {
      s += count_column(std::to_string(r.result.kernels.size())) + choice_columns(r.result.entry);
    } else {
      s += count_column("-") + choice_columns("rejected", "-", "-", "-", "-");
    }
  }
  return s;
}

std::string cache_table(const std::vector<TuneEntry>& entries) {
  std::vector<std::string> labels;
  for (const TuneEntry& e : entries) labels.push_back(e.cls.describe());
  const int width = label_width(labels);
  std::string s = label_column(width, "class") + choice_columns("kernel", "ms", "built-in", "ms", "speedup");
  for (const TuneEntry& e : entries) s += label_column(width, e.cls.describe()) + choice_columns(e);
  return s;
}

}  // namespace fa3::cli
