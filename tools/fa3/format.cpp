#include "format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace fa3::cli {

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string scientific(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*e", digits, value);
  return buf;
}

std::string significant(double value, int digits) {
  const double magnitude = value > 0 && std::isfinite(value) ? std::floor(std::log10(value)) : 0;
  return fixed(value, std::max(1, digits - 1 - static_cast<int>(magnitude)));
}

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return (u == 0 ? fixed(bytes, 0) : fixed(bytes, 1)) + " " + units[u];
}

namespace {
template <class T, class F>
std::string join_with(const std::vector<T>& values, F text) {
  std::string s;
  for (std::size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + text(values[i]);
  return s;
}
}  // namespace

std::string join(const std::vector<std::int64_t>& values) {
  return join_with(values, [](std::int64_t v) { return std::to_string(v); });
}
std::string join(const std::vector<int>& values) {
  return join_with(values, [](int v) { return std::to_string(v); });
}
std::string join(const std::vector<std::string>& values) {
  return join_with(values, [](const std::string& v) { return v; });
}

}  // namespace fa3::cli
