#include "run_report.h"

#include <cstdio>
#include <utility>

#include "format.h"

namespace fa3::cli {

void report(const char* key, const std::string& value) { std::printf("  %-8s %s\n", key, value.c_str()); }

std::string timing_summary(const Timing& t, const TimingConfig& config) {
  return fixed(t.median_ms, 3) + " ms (median of " + std::to_string(t.iters) + ", min " + fixed(t.min_ms, 3) +
         " ms, after " + std::to_string(config.warmup) + " warm-up)";
}

std::string speed_summary(double flops, const Timing& t, const std::string& note) {
  return significant(flops / (t.median_ms * 1e-3) / 1e12, 3) + " TFLOP/s (" + significant(flops / 1e9, 3) + " GFLOP" +
         (note.empty() ? "" : ", " + note) + ")";
}

std::string forward_summary(const RowCheck& c) {
  if (c.rows == 0) return "no rows compared (--check-rows 0); NaN scan of out and lse only";
  return std::to_string(c.rows) + " rows vs the exact reference: max |out - ref| " + scientific(c.max_out_error, 2) +
         ", max |lse - ref| " + scientific(c.max_lse_error, 2) + " (bound " + scientific(c.bound, 0) + ")";
}

std::vector<std::string> forward_failures(const RowCheck& c) {
  std::vector<std::string> why;
  if (c.passed) return why;
  if (c.nan_out) why.push_back(std::to_string(c.nan_out) + " NaN in out");
  if (c.nan_lse) why.push_back(std::to_string(c.nan_lse) + " NaN in lse");
  if (c.max_out_error > c.bound) why.push_back("out error above the bound");
  if (why.empty()) why.push_back("lse error above the bound");
  return why;
}

std::string gradient_summary(const char* name, const char* rows, const GradientCheck& c) {
  if (c.rows == 0) return std::string("no rows compared (--check-rows 0); NaN scan of ") + name + " only";
  const std::string n(name);
  return std::to_string(c.rows) + " " + rows + " vs the exact reference: max |" + n + " - ref| " +
         scientific(c.max_error, 2) + " (bound " + scientific(c.bound, 1) + ", max |ref| " +
         scientific(c.max_reference, 1) + ")";
}

std::vector<std::string> gradient_failures(const GradientChecks& c) {
  std::vector<std::string> why;
  const std::pair<const char*, const GradientCheck*> grads[] = {{"dq", &c.dq}, {"dk", &c.dk}, {"dv", &c.dv}};
  for (const auto& [name, g] : grads) {
    if (g->nans) why.push_back(std::to_string(g->nans) + " NaN in " + name);
    if (g->max_error > g->bound) why.push_back(std::string(name) + " error above the bound");
  }
  return why;
}

}  // namespace fa3::cli
