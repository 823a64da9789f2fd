// fa3 — the autotuning switch's default, from the environment.
#pragma once

namespace fa3 {

// Whether FA3_AUTOTUNE's value turns autotuning on: 1, true, yes or on (any case). Unset
// (null), empty or anything else leaves it off.
bool autotune_env_enables(const char* value);

}  // namespace fa3
