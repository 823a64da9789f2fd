// fa3 program — the commands. Each takes the arguments after its name, prints its
// report on stdout, and returns the exit status; it throws UsageError for a bad
// command line and RunError when the work fails.
#pragma once

#include <string>
#include <vector>

namespace fa3::cli {

int info_command(const std::vector<std::string>& args);
int run_command(const std::vector<std::string>& args);
int bench_command(const std::vector<std::string>& args);
int tune_command(const std::vector<std::string>& args);

}  // namespace fa3::cli
