// fa3 program — the usage text of the program and of each command.
#pragma once

namespace fa3::cli {

const char* main_usage();
const char* info_usage();
const char* run_usage();
const char* bench_usage();
const char* tune_usage();

}  // namespace fa3::cli
