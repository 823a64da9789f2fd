// fa3 program — number formatting for the reports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fa3::cli {

// printf-style "%.<digits>f" and "%.<digits>e".
std::string fixed(double value, int digits);
std::string scientific(double value, int digits);
// Fixed notation with at least `digits` significant digits and one decimal: 640.1,
// 12.3, 0.00181 (rates span five orders of magnitude between the CPU and the GPU).
std::string significant(double value, int digits);
// 2.5 GiB, 50.0 MiB, 512 B.
std::string bytes_text(double bytes);
// "64, 128, 256"
std::string join(const std::vector<std::int64_t>& values);
std::string join(const std::vector<int>& values);
std::string join(const std::vector<std::string>& values);

}  // namespace fa3::cli
