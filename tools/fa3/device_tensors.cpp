#include "device_tensors.h"

#include "errors.h"
#include "fa3/attention.h"

namespace fa3::cli {

DeviceTensors::DeviceTensors(const HostTensors& host)
    : q_(host.q_bytes()), k_(host.kv_bytes()), v_(host.v_bytes()), out_(host.out_bytes()), lse_(host.lse_bytes()) {
  const TensorPointers h = host.pointers();
  cuda_check(cudaMemcpy(q_.get(), h.q, host.q_bytes(), cudaMemcpyHostToDevice), "cudaMemcpy of q");
  cuda_check(cudaMemcpy(k_.get(), h.k, host.kv_bytes(), cudaMemcpyHostToDevice), "cudaMemcpy of k");
  cuda_check(cudaMemcpy(v_.get(), h.v, host.v_bytes(), cudaMemcpyHostToDevice), "cudaMemcpy of v");
  cuda_check(cudaMemset(out_.get(), 0xff, host.out_bytes()), "cudaMemset of out");
  cuda_check(cudaMemset(lse_.get(), 0xff, host.lse_bytes()), "cudaMemset of lse");
  if (host.sinks_bytes() > 0) {
    sinks_ = DeviceBuffer(host.sinks_bytes());
    cuda_check(cudaMemcpy(sinks_.get(), h.sinks, host.sinks_bytes(), cudaMemcpyHostToDevice), "cudaMemcpy of sinks");
  }
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the uploads");
}

void DeviceTensors::download_outputs(HostTensors& host) const {
  const TensorPointers h = host.pointers();
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before reading the outputs");
  cuda_check(cudaMemcpy(h.out, out_.get(), host.out_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy of out");
  cuda_check(cudaMemcpy(h.lse, lse_.get(), host.lse_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy of lse");
}

ForwardArgs with_forward_workspace(ForwardArgs args, DeviceBuffer& buffer) {
  std::size_t bytes = 0;
  throw_if_error(forward_workspace_size(args, &bytes));
  if (bytes == 0) return args;
  buffer = DeviceBuffer(bytes);
  args.workspace = buffer.get();
  args.workspace_bytes = bytes;
  return args;
}

DeviceGradients::DeviceGradients(const HostGradients& host)
    : dout_(host.out_bytes()), dq_(host.q_bytes()), dk_(host.kv_bytes()), dv_(host.v_bytes()) {
  cuda_check(cudaMemcpy(dout_.get(), host.pointers().dout, host.out_bytes(), cudaMemcpyHostToDevice),
             "cudaMemcpy of dout");
  cuda_check(cudaMemset(dq_.get(), 0xff, host.q_bytes()), "cudaMemset of dq");
  cuda_check(cudaMemset(dk_.get(), 0xff, host.kv_bytes()), "cudaMemset of dk");
  cuda_check(cudaMemset(dv_.get(), 0xff, host.v_bytes()), "cudaMemset of dv");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the uploads");
}

void DeviceGradients::download_gradients(HostGradients& host) const {
  const GradientPointers h = host.pointers();
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before reading the gradients");
  cuda_check(cudaMemcpy(h.dq, dq_.get(), host.q_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy of dq");
  cuda_check(cudaMemcpy(h.dk, dk_.get(), host.kv_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy of dk");
  cuda_check(cudaMemcpy(h.dv, dv_.get(), host.v_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy of dv");
}

}  // namespace fa3::cli
