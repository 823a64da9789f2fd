#include "api/validate_merge.h"

#include <cstddef>
#include <string>

#include "api/validate_messages.h"
#include "common/status_macros.h"

namespace fa3 {
namespace {

using detail::cat;
using detail::invalid;
using detail::shape_string;
using detail::unsupported;

std::string part_name(const char* list, std::size_t i) { return cat(list, "[", static_cast<std::int64_t>(i), "]"); }

// Rank, pointer and strides: what any one tensor needs before shapes are compared.
Status check_tensor(const std::string& name, const TensorView& t, int rank, const char* layout) {
  if (!t.defined()) return invalid(cat(name, ": data pointer is null"));
  if (t.rank != rank) return invalid(cat(name, ": expected a ", rank, "-d tensor ", layout, ", got rank ", t.rank));
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] < 0) return invalid(cat(name, ": shape ", shape_string(t), " has a negative size"));
    if (t.stride[d] < 0) return invalid(cat(name, ": stride must be >= 0, got ", t.stride[d]));
  }
  return Status::ok();
}

Status check_out(const std::string& name, const TensorView& t, const TensorView& first) {
  FA3_RETURN_IF_ERROR(check_tensor(name, t, 4, "(batch, seqlen, nheads, head_dim)"));
  if (t.dtype != DType::kFloat32 && t.dtype != DType::kFloat16 && t.dtype != DType::kBFloat16) {
    return invalid(cat(name, ": dtype must be fp32, fp16 or bf16, got ", dtype_name(t.dtype)));
  }
  for (int d = 0; d < 4; ++d) {
    if (t.shape[d] != first.shape[d]) {
      return invalid(cat(name, ": shape ", shape_string(t), " differs from outs[0]'s ", shape_string(first)));
    }
  }
  return Status::ok();
}

Status check_lse(const std::string& name, const TensorView& t, const TensorView& out0) {
  FA3_RETURN_IF_ERROR(check_tensor(name, t, 3, "(batch, nheads, seqlen)"));
  if (t.dtype != DType::kFloat32) return invalid(cat(name, ": dtype must be fp32, got ", dtype_name(t.dtype)));
  const std::int64_t want[3] = {out0.shape[0], out0.shape[2], out0.shape[1]};
  if (t.shape[0] != want[0] || t.shape[1] != want[1] || t.shape[2] != want[2]) {
    return invalid(cat(name, ": shape ", shape_string(t), " must be (batch, nheads, seqlen) = (", want[0], ", ",
                       want[1], ", ", want[2], ")"));
  }
  return Status::ok();
}

// On a device target, where a tensor lives: memory of the current device.
Status check_located(const std::string& name, const TensorView& t, const ValidationTarget& target) {
  if (target.space == ValidationTarget::Space::kHost || !target.locate) return Status::ok();
  const std::string where = target.locate(t.data);
  if (where.empty()) return Status::ok();
  return invalid(cat(name, ": pointer is ", where, ", not memory of the current CUDA device"));
}

}  // namespace

Status validate_merge(const MergeArgs& args) {
  ValidationTarget host;
  host.space = ValidationTarget::Space::kHost;
  return validate_merge(args, host);
}

Status validate_merge(const MergeArgs& args, const ValidationTarget& target) {
  if (args.outs.empty()) return invalid("outs: at least one part is needed, got none");
  if (args.lses.size() != args.outs.size()) {
    return invalid(cat("lses: one per part is needed: got ", static_cast<std::int64_t>(args.lses.size()), " for ",
                       static_cast<std::int64_t>(args.outs.size()), " outs"));
  }
  const TensorView& first = args.outs[0];
  FA3_RETURN_IF_ERROR(check_tensor("outs[0]", first, 4, "(batch, seqlen, nheads, head_dim)"));
  for (std::size_t i = 0; i < args.outs.size(); ++i) {
    FA3_RETURN_IF_ERROR(check_out(part_name("outs", i), args.outs[i], first));
    FA3_RETURN_IF_ERROR(check_lse(part_name("lses", i), args.lses[i], first));
  }
  FA3_RETURN_IF_ERROR(check_out("out", args.out, first));
  FA3_RETURN_IF_ERROR(check_lse("lse", args.lse, first));
  for (std::size_t i = 0; i < args.outs.size(); ++i) {
    FA3_RETURN_IF_ERROR(check_located(part_name("outs", i), args.outs[i], target));
    FA3_RETURN_IF_ERROR(check_located(part_name("lses", i), args.lses[i], target));
  }
  FA3_RETURN_IF_ERROR(check_located("out", args.out, target));
  FA3_RETURN_IF_ERROR(check_located("lse", args.lse, target));
  if (target.max_merge_parts != 0 && args.outs.size() > target.max_merge_parts) {
    return unsupported(cat("outs: the GPU merge takes at most ", static_cast<std::int64_t>(target.max_merge_parts),
                           " parts, got ", static_cast<std::int64_t>(args.outs.size()),
                           "; merge them in groups (each group's out and lse are a part of the next merge)"));
  }
  return Status::ok();
}

}  // namespace fa3
