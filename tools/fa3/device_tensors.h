// fa3 program — device copies of the host tensors and gradients, for the GPU path.
#pragma once

#include "cuda_resources.h"
#include "host_tensors.h"
#include "shape.h"

namespace fa3::cli {

class DeviceTensors {
 public:
  // Uploads q, k, v and the sinks (when there are); fills out and lse with the NaN
  // pattern, as on the host.
  explicit DeviceTensors(const HostTensors& host);

  TensorPointers pointers() const {
    return {
        q_.get(), k_.get(), v_.get(), out_.get(), static_cast<float*>(lse_.get()), static_cast<float*>(sinks_.get())};
  }

  // Copies out and lse into the host tensors (waits for all device work first).
  void download_outputs(HostTensors& host) const;

 private:
  DeviceBuffer q_, k_, v_, out_, lse_;
  DeviceBuffer sinks_;  // unallocated (null) without sinks
};

// `args` with the workspace a GPU forward call needs (V transposed, for e4m3 inputs;
// none otherwise), allocated into `buffer`, which must outlive the calls.
ForwardArgs with_forward_workspace(ForwardArgs args, DeviceBuffer& buffer);

class DeviceGradients {
 public:
  // Uploads dout; fills dq, dk and dv with the NaN pattern, as on the host.
  explicit DeviceGradients(const HostGradients& host);

  GradientPointers pointers() const { return {dout_.get(), dq_.get(), dk_.get(), dv_.get()}; }

  // Copies dq, dk and dv into the host gradients (waits for all device work first).
  void download_gradients(HostGradients& host) const;

 private:
  DeviceBuffer dout_, dq_, dk_, dv_;
};

}  // namespace fa3::cli
