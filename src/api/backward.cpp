#include <string>

#include "api/device_cache.h"
#include "api/validate.h"
#include "common/status_macros.h"
#include "fa3/attention.h"
#include "hopper/bwd_dispatch.h"

namespace fa3 {

Status backward(const BackwardArgs& args, cudaStream_t stream) {
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_backward(args, gpu_backward_target(), &problem));
  const DeviceInfo* dev = nullptr;
  FA3_RETURN_IF_ERROR(current_device_cached(&dev));
  if (!dev->is_hopper()) {
    return {StatusCode::kNotSupported, "fa3::backward needs a Hopper GPU (compute capability 9.0); device " +
                                           std::to_string(dev->index) + " (" + dev->name + ") is " +
                                           std::to_string(dev->cc_major) + "." + std::to_string(dev->cc_minor)};
  }
  return hopper::run_backward(problem, args, problem.usable_sms(dev->sm_count), stream);
}

Status backward_workspace_size(const BackwardArgs& args, std::size_t* bytes) {
  ValidationTarget target = gpu_backward_target();
  target.locate = nullptr;
  target.backward_workspace = nullptr;
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_backward(args, target, &problem));
  *bytes = hopper::bwd_workspace(problem, args.deterministic).bytes;
  return Status::ok();
}

}  // namespace fa3
