// fa3 Python extension — KV-cache attention and the combine of split results
// (fa3/kvcache.h) over DLPack tensors.
#pragma once

#include <nanobind/nanobind.h>

namespace fa3::python {

// Adds forward_with_kvcache and combine to `m`.
void register_kvcache_bindings(nanobind::module_& m);

}  // namespace fa3::python
