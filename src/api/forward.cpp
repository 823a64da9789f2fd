#include <cuda_runtime_api.h>

#include <string>

#include "api/device_cache.h"
#include "api/validate.h"
#include "common/status_macros.h"
#include "fa3/attention.h"
#include "hopper/fwd_dispatch.h"

namespace fa3 {

Status forward(const ForwardArgs& args, cudaStream_t stream) {
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_forward(args, gpu_target(), &problem));
  const DeviceInfo* dev = nullptr;
  FA3_RETURN_IF_ERROR(current_device_cached(&dev));
  if (!dev->is_hopper()) {
    return {StatusCode::kNotSupported, "fa3::forward needs a Hopper GPU (compute capability 9.0); device " +
                                           std::to_string(dev->index) + " (" + dev->name + ") is " +
                                           std::to_string(dev->cc_major) + "." + std::to_string(dev->cc_minor)};
  }
  return hopper::run_forward(problem, args, dev->sm_count, stream);
}

}  // namespace fa3
