// fa3 Python extension — autotuning: the switch, fa3::tune_forward over DLPack tensors,
// and the tuning cache's files.
#pragma once

#include <nanobind/nanobind.h>

namespace fa3::python {

// Adds set_autotune, autotune_enabled, tune_forward, tune_key, tune_cache_path,
// read_tune_cache and write_tune_cache to `m`.
void register_tune_bindings(nanobind::module_& m);

}  // namespace fa3::python
