// The GPU entry points of KV-cache and combine calls: every rule is checked, so that a
// wrong call says what is wrong, then the call is refused (kNotSupported) until kernels
// exist; nothing is written or enqueued.
#include "fa3/kvcache.h"

#include "api/validate_kvcache.h"

namespace fa3 {

Status forward_with_kvcache(const KvCacheArgs& args, cudaStream_t) {
  KvCacheProblem problem;
  return validate_kvcache(args, gpu_target(), &problem);
}

Status combine(const CombineArgs& args, cudaStream_t) {
  CombineProblem problem;
  return validate_combine(args, gpu_target(), &problem);
}

}  // namespace fa3
