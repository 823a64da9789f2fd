// fa3 program — command-line flags: declaring them, applying them, parsing their values.
//
// Flags are spelled --name VALUE or --name=VALUE, switches --name. Every parse error
// throws UsageError with a one-line message that names the flag.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fa3/tensor.h"

namespace fa3::cli {

struct Flag {
  std::string name;  // without the leading "--"
  bool takes_value = true;
  std::function<void(const std::string& value)> apply;  // value is "" for a switch
};

// Applies `args` to `flags` left to right; a later flag overrides an earlier one.
void apply_flags(const std::vector<std::string>& args, const std::vector<Flag>& flags);

// True when any argument is -h or --help (help wins over every other argument).
bool asks_for_help(const std::vector<std::string>& args);

std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min, std::int64_t max);
// A finite number >= 0.
double parse_nonnegative(const std::string& flag, const std::string& text);
// Comma-separated finite numbers; at least one.
std::vector<double> parse_number_list(const std::string& flag, const std::string& text);
// Comma-separated integers in [min, max]; at least one.
std::vector<std::int64_t> parse_int_list(const std::string& flag, const std::string& text, std::int64_t min,
                                         std::int64_t max);
// "L,R": two integers >= -1.
std::pair<int, int> parse_window(const std::string& flag, const std::string& text);
// bf16 | fp16 | fp32.
DType parse_dtype(const std::string& flag, const std::string& text);

enum class DeviceChoice { kAuto, kGpu, kCpu };
// auto | gpu | cpu.
DeviceChoice parse_device(const std::string& flag, const std::string& text);

}  // namespace fa3::cli
