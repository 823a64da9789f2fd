// The GPU entry points of the exact merge of partial results: merge_attention_states
// (fa3/merge.h) and the split-KV combine (fa3/kvcache.h). Both validate every rule
// before anything is enqueued, so a rejected call writes nothing, then run the merge
// kernel (hopper/merge.h), which is built for sm_90a like every kernel of fa3.
#include "fa3/merge.h"

#include <cuda_runtime_api.h>

#include <string>

#include "api/device_cache.h"
#include "api/validate_kvcache.h"
#include "api/validate_merge.h"
#include "common/status_macros.h"
#include "fa3/kvcache.h"
#include "hopper/merge.h"

namespace fa3 {
namespace {

Status require_hopper(const char* call) {
  const DeviceInfo* dev = nullptr;
  FA3_RETURN_IF_ERROR(current_device_cached(&dev));
  if (dev->is_hopper()) return Status::ok();
  return {StatusCode::kNotSupported, std::string(call) + " needs a Hopper GPU (compute capability 9.0); device " +
                                         std::to_string(dev->index) + " (" + dev->name + ") is " +
                                         std::to_string(dev->cc_major) + "." + std::to_string(dev->cc_minor)};
}

}  // namespace

Status merge_attention_states(const MergeArgs& args, cudaStream_t stream) {
  FA3_RETURN_IF_ERROR(validate_merge(args, gpu_merge_target()));
  FA3_RETURN_IF_ERROR(require_hopper("fa3::merge_attention_states"));
  return hopper::launch_merge(args, stream);
}

Status combine(const CombineArgs& args, cudaStream_t stream) {
  CombineProblem problem;
  FA3_RETURN_IF_ERROR(validate_combine(args, gpu_merge_target(), &problem));
  FA3_RETURN_IF_ERROR(require_hopper("fa3::combine"));
  return hopper::launch_combine(problem, args, stream);
}

}  // namespace fa3
