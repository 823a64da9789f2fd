#include "api/tune_class.h"

#include <string>

#include "api/validate.h"
#include "common/status_macros.h"

namespace fa3 {
namespace {

// Sizes are at most int32's maximum, so buckets stop at 2^31.
constexpr std::int64_t kLargestBucket = std::int64_t{1} << 31;

}  // namespace

const char* tune_direction_name(TuneDirection direction) {
  switch (direction) {
    case TuneDirection::kForward:
      return "fwd";
  }
  return "?";
}

std::int64_t tune_bucket(std::int64_t n) {
  std::int64_t bucket = 1;
  while (bucket < n) bucket *= 2;
  return bucket;
}

bool is_tune_bucket(std::int64_t n) { return n >= 1 && n <= kLargestBucket && (n & (n - 1)) == 0; }

TuneClass tune_class_of(const Problem& p, DType dtype) {
  TuneClass c;
  c.direction = TuneDirection::kForward;
  c.dtype = dtype;
  c.head_dim = static_cast<int>(p.head_dim);
  c.causal = p.causal;
  c.seqlen_q = tune_bucket(p.seqlen_q);
  c.seqlen_k = tune_bucket(p.seqlen_k);
  c.gqa = tune_bucket(p.group_size());
  return c;
}

std::string TuneClass::describe() const {
  return std::string(tune_direction_name(direction)) + " " + dtype_name(dtype) + " hdim" + std::to_string(head_dim) +
         (causal ? " causal" : " plain") + " q<=" + std::to_string(seqlen_q) + " k<=" + std::to_string(seqlen_k) +
         " gqa" + std::to_string(gqa);
}

Status tune_class(const ForwardArgs& args, TuneClass* cls) {
  // The class depends on shapes and options only: no pointer is looked at.
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_forward(args, gpu_shape_target(), &problem));
  *cls = tune_class_of(problem, args.q.dtype);
  return Status::ok();
}

}  // namespace fa3
