// fa3 program — the lines of `fa3 run`'s report.
#pragma once

#include <string>
#include <vector>

#include "grad_check.h"
#include "row_check.h"
#include "timing.h"

namespace fa3::cli {

// "  key      value", the report's one layout.
void report(const char* key, const std::string& value);

// "0.123 ms (median of 20, min 0.120 ms, after 5 warm-up)"
std::string timing_summary(const Timing& t, const TimingConfig& config);
// "640.1 TFLOP/s (1.07 GFLOP)", or with a note on how the FLOPs were counted:
// "(2.68 GFLOP, <note>)".
std::string speed_summary(double flops, const Timing& t, const std::string& note = "");

// The forward check's line, and why it failed (nothing when it passed).
std::string forward_summary(const RowCheck& c);
std::vector<std::string> forward_failures(const RowCheck& c);

// A gradient's line ("dq", the query rows it covered...), and why the gradients
// failed (nothing when they passed).
std::string gradient_summary(const char* name, const char* rows, const GradientCheck& c);
std::vector<std::string> gradient_failures(const GradientChecks& c);

}  // namespace fa3::cli
