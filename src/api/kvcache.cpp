// The GPU entry point of KV-cache calls: every rule is checked, so that a wrong call
// says what is wrong, then the call is refused (kNotSupported) until kernels exist;
// nothing is written or enqueued. The combine runs on the merge kernel (api/merge.cpp).
#include "fa3/kvcache.h"

#include "api/validate_kvcache.h"

namespace fa3 {

Status forward_with_kvcache(const KvCacheArgs& args, cudaStream_t) {
  KvCacheProblem problem;
  return validate_kvcache(args, gpu_target(), &problem);
}

}  // namespace fa3
