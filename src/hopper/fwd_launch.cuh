// Placeholder until the kernel lands.
#pragma once
#include <cutlass/numeric_types.h>
#include "fa3/status.h"
#include "hopper/fwd_params.h"
namespace fa3::hopper {
struct NoMask {};
struct CausalMask {};
template <class Element, int kHeadDim, class Mask>
Status launch_fwd(const FwdParams&, cudaStream_t) { return {StatusCode::kNotSupported, "kernel not built yet"}; }
}
