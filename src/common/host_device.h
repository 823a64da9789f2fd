// fa3 — FA3_HOST_DEVICE marks the functions that host code (the CPU path, host tests) and
// the kernels share: __host__ __device__ under nvcc, nothing for the host compiler.
#pragma once

#if defined(__CUDACC__)
#define FA3_HOST_DEVICE __host__ __device__
#else
#define FA3_HOST_DEVICE
#endif
