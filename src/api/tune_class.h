// fa3 — the problem classes of the tuning cache, from validated problems.
#pragma once

#include <cstdint>

#include "api/problem.h"
#include "fa3/tune.h"

namespace fa3 {

// "fwd": the direction's name in class descriptions and cache files.
const char* tune_direction_name(TuneDirection direction);

// The bucket of a size n >= 1: the smallest power of two >= n (1, 2, 4, 4, 8, ...).
std::int64_t tune_bucket(std::int64_t n);

// Whether `n` names a bucket: a power of two from 1 to the bucket of the largest size
// the library takes (2^31).
bool is_tune_bucket(std::int64_t n);

// The class of a problem the GPU accepts (no window, no softcap) with inputs of `dtype`.
TuneClass tune_class_of(const Problem& problem, DType dtype);

}  // namespace fa3
