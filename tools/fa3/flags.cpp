#include "flags.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>

#include "errors.h"

namespace fa3::cli {
namespace {

[[noreturn]] void bad_value(const std::string& flag, const std::string& what, const std::string& text) {
  throw UsageError("--" + flag + ": expected " + what + ", got '" + text + "'");
}

// Whole-string integer parse; std::from_chars accepts no spaces, signs other than '-',
// or trailing characters, which is the strictness a flag value wants.
bool to_int(std::string_view text, std::int64_t* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return ec == std::errc() && ptr == end && !text.empty();
}

// Whole-string finite number parse, as strict as to_int.
bool to_finite(std::string_view text, double* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return ec == std::errc() && ptr == end && !text.empty() && std::isfinite(*value);
}

std::vector<std::string_view> split_commas(std::string_view text) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    std::size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) return parts;
    start = comma + 1;
  }
}

}  // namespace

void apply_flags(const std::vector<std::string>& args, const std::vector<Flag>& flags) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) throw UsageError("unexpected argument '" + arg + "'");
    const std::size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const Flag* flag = nullptr;
    for (const Flag& f : flags) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) throw UsageError("unknown option '--" + name + "'");
    if (!flag->takes_value) {
      if (eq != std::string::npos) throw UsageError("--" + name + " takes no value");
      flag->apply("");
      continue;
    }
    if (eq != std::string::npos) {
      flag->apply(arg.substr(eq + 1));
      continue;
    }
    // A following option is a forgotten value, not a value that starts with "--".
    if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) throw UsageError("--" + name + " needs a value");
    flag->apply(args[++i]);
  }
}

bool asks_for_help(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") return true;
  }
  return false;
}

std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min, std::int64_t max) {
  std::int64_t v = 0;
  if (!to_int(text, &v)) bad_value(flag, "an integer", text);
  if (v < min || v > max) {
    throw UsageError("--" + flag + ": " + text + " is out of range (" + std::to_string(min) + " to " +
                     std::to_string(max) + ")");
  }
  return v;
}

double parse_nonnegative(const std::string& flag, const std::string& text) {
  double v = 0;
  if (!to_finite(text, &v) || v < 0) bad_value(flag, "a finite number >= 0", text);
  return v;
}

std::vector<double> parse_number_list(const std::string& flag, const std::string& text) {
  std::vector<double> values;
  for (std::string_view part : split_commas(text)) {
    double v = 0;
    if (!to_finite(part, &v)) bad_value(flag, "a finite number or a comma-separated list of them", text);
    values.push_back(v);
  }
  return values;
}

std::vector<std::int64_t> parse_int_list(const std::string& flag, const std::string& text, std::int64_t min,
                                         std::int64_t max) {
  std::vector<std::int64_t> values;
  for (std::string_view part : split_commas(text)) values.push_back(parse_int(flag, std::string(part), min, max));
  return values;
}

std::pair<int, int> parse_window(const std::string& flag, const std::string& text) {
  const std::vector<std::string_view> parts = split_commas(text);
  if (parts.size() != 2) bad_value(flag, "LEFT,RIGHT (e.g. 256,0)", text);
  constexpr std::int64_t kMax = std::numeric_limits<int>::max();
  return {static_cast<int>(parse_int(flag, std::string(parts[0]), -1, kMax)),
          static_cast<int>(parse_int(flag, std::string(parts[1]), -1, kMax))};
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  if (text == "bf16") return DType::kBFloat16;
  if (text == "fp16") return DType::kFloat16;
  if (text == "fp32") return DType::kFloat32;
  if (text == "e4m3") return DType::kFloat8E4M3;
  bad_value(flag, "bf16, fp16, fp32 or e4m3", text);
}

DeviceChoice parse_device(const std::string& flag, const std::string& text) {
  if (text == "auto") return DeviceChoice::kAuto;
  if (text == "gpu") return DeviceChoice::kGpu;
  if (text == "cpu") return DeviceChoice::kCpu;
  bad_value(flag, "auto, gpu or cpu", text);
}

}  // namespace fa3::cli
