// The extension's common ground between the library and Python: a Status raised as
// the matching Python exception, and a call made on a chosen CUDA device.
#pragma once

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>

#include <string>

#include "fa3/status.h"

namespace fa3::python {

// ValueError (invalid argument), NotImplementedError (not supported), RuntimeError
// (CUDA or internal error), with the library's message.
inline void raise_if_error(const Status& status) {
  if (status.is_ok()) return;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      PyErr_SetString(PyExc_ValueError, status.message().c_str());
      break;
    case StatusCode::kNotSupported:
      PyErr_SetString(PyExc_NotImplementedError, status.message().c_str());
      break;
    default:
      PyErr_SetString(PyExc_RuntimeError, status.to_string().c_str());
  }
  throw nanobind::python_error();
}

// Runs `fn` with CUDA device `device` current, then restores the caller's device,
// so that a tensor on cuda:1 works whatever device the calling thread had selected;
// device -1 runs on whatever device is current.
template <class Fn>
Status on_device(int device, Fn&& fn) {
  if (device < 0) return fn();
  int previous = 0;
  cudaError_t err = cudaGetDevice(&previous);
  if (err == cudaSuccess && previous != device) err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return {StatusCode::kCudaError,
            "cannot make CUDA device " + std::to_string(device) + " current: " + cudaGetErrorString(err)};
  }
  Status status = fn();
  if (previous != device) cudaSetDevice(previous);
  return status;
}

}  // namespace fa3::python
