// fa3 program — the tables of `fa3 tune`: the classes it timed, and the cache's entries.
#pragma once

#include <string>
#include <vector>

#include "fa3/tune.h"

namespace fa3::cli {

// One problem `fa3 tune` timed, or why the library refused it.
struct TuneRow {
  std::string label;  // the class, or the shape when the library refused it
  TuneResult result;
  std::string error;
};

// Class, kernels timed, the fastest and its time, the built-in choice and its time, and
// the speedup of the fastest over the built-in choice.
std::string tune_table(const std::vector<TuneRow>& rows);

// The same columns, from the cache (without the count of kernels timed).
std::string cache_table(const std::vector<TuneEntry>& entries);

}  // namespace fa3::cli
