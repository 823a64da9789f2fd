#include "api/validate.h"
#include "common/status_macros.h"
#include "fa3/attention.h"

namespace fa3 {

Status backward(const BackwardArgs& args, cudaStream_t /*stream*/) {
  Problem problem;
  ValidationTarget target = gpu_target();
  FA3_RETURN_IF_ERROR(validate_backward(args, target, &problem));
  return {StatusCode::kNotSupported, "the backward pass is not implemented on the GPU yet (fa3::cpu::backward runs "
                                     "the reference on host memory)"};
}

}  // namespace fa3
