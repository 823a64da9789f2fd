// The GPU entry point of KV-cache calls: every rule is checked, so that a wrong call
// says what is wrong, then the call runs on the KV-cache kernels (hopper/kvcache.h) in a
// build with FA3_GPU_KVCACHE, or is refused (kNotSupported); a rejected call writes and
// enqueues nothing. The combine runs on the merge kernel (api/merge.cpp).
#include "fa3/kvcache.h"

#include <string>

#include "api/device_cache.h"
#include "api/validate_kvcache.h"
#include "common/status_macros.h"
#include "hopper/kvcache.h"

namespace fa3 {
namespace {

Status hopper_device(const DeviceInfo** dev) {
  FA3_RETURN_IF_ERROR(current_device_cached(dev));
  if ((*dev)->is_hopper()) return Status::ok();
  return {StatusCode::kNotSupported, "fa3::forward_with_kvcache needs a Hopper GPU (compute capability 9.0); device " +
                                         std::to_string((*dev)->index) + " (" + (*dev)->name + ") is " +
                                         std::to_string((*dev)->cc_major) + "." + std::to_string((*dev)->cc_minor)};
}

}  // namespace

Status forward_with_kvcache(const KvCacheArgs& args, cudaStream_t stream) {
  KvCacheProblem problem;
  FA3_RETURN_IF_ERROR(validate_kvcache(args, gpu_kvcache_target(), &problem));
  const DeviceInfo* dev = nullptr;
  FA3_RETURN_IF_ERROR(hopper_device(&dev));
  hopper::KvCachePlan plan;
  FA3_RETURN_IF_ERROR(hopper::plan_kvcache(problem, args.q.dtype, args.num_splits,
                                                  problem.attention.usable_sms(dev->sm_count), &plan));
  return hopper::run_kvcache(problem, args, plan, stream);
}

Status kvcache_workspace_size(const KvCacheArgs& args, std::size_t* bytes) {
  ValidationTarget target = gpu_kvcache_target();
  target.locate = nullptr;
  target.kvcache_workspace = nullptr;
  KvCacheProblem problem;
  FA3_RETURN_IF_ERROR(validate_kvcache(args, target, &problem));
  const DeviceInfo* dev = nullptr;
  FA3_RETURN_IF_ERROR(hopper_device(&dev));
  hopper::KvCachePlan plan;
  FA3_RETURN_IF_ERROR(hopper::plan_kvcache(problem, args.q.dtype, args.num_splits,
                                                  problem.attention.usable_sms(dev->sm_count), &plan));
  *bytes = plan.bytes;
  return Status::ok();
}

}  // namespace fa3
