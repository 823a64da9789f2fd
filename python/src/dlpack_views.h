// fa3 Python extension — DLPack arrays (as nanobind ndarrays) turned into fa3::TensorView.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <string>

#include "fa3/tensor.h"

namespace fa3::python {

namespace nb = nanobind;

using InArray = nb::ndarray<nb::ro>;  // read by the call
using OutArray = nb::ndarray<>;       // written by the call (a read-only array is refused)

// Where the tensors of one call live. The first tensor fixes the device; every
// other must be on the same one, since the C++ layer receives bare pointers.
class Placement {
 public:
  void check(const char* name, int device_type, int device_id);

  bool on_host() const;
  bool on_cuda() const;
  int device_id() const { return device_id_; }
  std::string describe() const;

 private:
  bool set_ = false;
  int device_type_ = 0;
  int device_id_ = 0;
  std::string first_name_;
};

// Checks what a view cannot express (rank, element type, device) and throws
// nb::value_error naming the argument; the C++ API checks everything else.
TensorView make_view(const char* name, nb::dlpack::dtype dtype, std::size_t ndim, const std::int64_t* shape,
                     const std::int64_t* stride, void* data, int device_type, int device_id, Placement& placement);

// Caller-owned scratch memory, as the C++ API takes it.
struct ByteBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// Checks that `a` is a contiguous 1-d uint8 array on the call's device and throws
// nb::value_error naming it otherwise.
ByteBuffer to_bytes(const char* name, const OutArray& a, Placement& placement);

template <class Array>
TensorView to_view(const char* name, const Array& a, Placement& placement) {
  return make_view(name, a.dtype(), a.ndim(), a.shape_ptr(), a.stride_ptr(),
                   const_cast<void*>(static_cast<const void*>(a.data())), a.device_type(), a.device_id(), placement);
}

}  // namespace fa3::python
