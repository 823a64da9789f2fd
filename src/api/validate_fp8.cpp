#include "api/validate_fp8.h"

#include <cstdint>
#include <string>

#include "api/validate_messages.h"
#include "common/status_macros.h"

namespace fa3 {
namespace {

using detail::cat;
using detail::invalid;
using detail::shape_string;
using detail::unsupported;

bool on_device(const ValidationTarget& target) { return target.space == ValidationTarget::Space::kDevice; }

struct NamedScale {
  const char* name;
  const TensorView* view;
};

// The six scale tensors, in the order their rules are checked.
struct Scales {
  NamedScale all[6];

  explicit Scales(const Fp8Args& f)
      : all{{"q_descale", &f.q_descale},         {"k_descale", &f.k_descale},
            {"v_descale", &f.v_descale},         {"q_block_scale", &f.q_block_scale},
            {"k_block_scale", &f.k_block_scale}, {"v_block_scale", &f.v_block_scale}} {}
};

// One fp32 scale tensor of the expected shape (`dims` names its dimensions for the
// message), at non-negative strides, and on a device target aligned and in the current
// device's memory.
Status check_scale(const char* name, const TensorView& t, const std::int64_t* shape, int rank, const char* dims,
                   const ValidationTarget& target) {
  const std::string n = name;
  if (t.rank != rank) return invalid(cat(n, ": expected a ", rank, "-d tensor ", dims, ", got rank ", t.rank));
  if (t.dtype != DType::kFloat32) return invalid(n + ": dtype must be fp32, got " + dtype_name(t.dtype));
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] != shape[d]) {
      std::string want = "(";
      for (int e = 0; e < rank; ++e) want += (e ? ", " : "") + std::to_string(shape[e]);
      return invalid(cat(n, ": shape ", shape_string(t), " must be ", dims, " = ", want, ")"));
    }
    if (t.stride[d] < 0) return invalid(cat(n, ": stride of dim ", d, " must be >= 0, got ", t.stride[d]));
  }
  if (on_device(target)) {
    if (reinterpret_cast<std::uintptr_t>(t.data) % sizeof(float) != 0) {
      return invalid(n + ": data pointer is not aligned to its element size");
    }
    if (target.locate) {
      const std::string where = target.locate(t.data);
      if (!where.empty()) return invalid(n + ": pointer is " + where + ", not memory of the current CUDA device");
    }
  }
  return Status::ok();
}

std::int64_t blocks(std::int64_t rows, int block_rows) { return (rows + block_rows - 1) / block_rows; }

}  // namespace

Status check_fp8_dtypes(const ForwardArgs& a) {
  if (a.q.dtype != DType::kFloat8E4M3) {
    const Scales scales(a.fp8);
    for (const NamedScale& s : scales.all) {
      if (s.view->data != nullptr) {
        return invalid(std::string(s.name) + ": given, but q's dtype is " + dtype_name(a.q.dtype) +
                       "; FP8 scales apply to e4m3 inputs only");
      }
    }
    return Status::ok();
  }
  if (a.out.dtype != DType::kBFloat16 && a.out.dtype != DType::kFloat16) {
    return invalid(std::string("out: dtype must be bf16 or fp16 for e4m3 inputs, got ") + dtype_name(a.out.dtype));
  }
  return Status::ok();
}

Status check_fp8_scales(const ForwardArgs& a, const Problem& p, const ValidationTarget& target) {
  const Fp8Args& f = a.fp8;
  const std::int64_t descale_shape[2] = {p.batch, p.nheads_kv};
  for (const NamedScale& s : {NamedScale{"q_descale", &f.q_descale}, NamedScale{"k_descale", &f.k_descale},
                              NamedScale{"v_descale", &f.v_descale}}) {
    if (s.view->data != nullptr) {
      FA3_RETURN_IF_ERROR(check_scale(s.name, *s.view, descale_shape, 2, "(batch, nheads_kv)", target));
    }
  }
  if (!f.has_block_scales()) return Status::ok();
  for (const NamedScale& s : {NamedScale{"q_block_scale", &f.q_block_scale},
                              NamedScale{"k_block_scale", &f.k_block_scale},
                              NamedScale{"v_block_scale", &f.v_block_scale}}) {
    if (s.view->data == nullptr) {
      return invalid(std::string(s.name) +
                     ": missing; block quantization scales q, k and v (give all three block scales or none)");
    }
  }
  if (f.block_rows < 1) return invalid(cat("block_rows must be >= 1, got ", f.block_rows));
  // A varlen call's blocks start at each sequence's first row, and p's lengths are the
  // max_seqlen bounds: (sequence, head, block of that sequence).
  const std::int64_t q_shape[3] = {p.batch, p.nheads_q, blocks(p.seqlen_q, f.block_rows)};
  const std::int64_t kv_shape[3] = {p.batch, p.nheads_kv, blocks(p.seqlen_k, f.block_rows)};
  const char* q_dims = p.varlen ? "(batch, nheads_q, ceil(max_seqlen_q / block_rows))"
                                : "(batch, nheads_q, ceil(seqlen_q / block_rows))";
  const char* kv_dims = p.varlen ? "(batch, nheads_kv, ceil(max_seqlen_k / block_rows))"
                                 : "(batch, nheads_kv, ceil(seqlen_k / block_rows))";
  FA3_RETURN_IF_ERROR(check_scale("q_block_scale", f.q_block_scale, q_shape, 3, q_dims, target));
  FA3_RETURN_IF_ERROR(check_scale("k_block_scale", f.k_block_scale, kv_shape, 3, kv_dims, target));
  FA3_RETURN_IF_ERROR(check_scale("v_block_scale", f.v_block_scale, kv_shape, 3, kv_dims, target));
  return Status::ok();
}

Status check_fp8_supported(const ForwardArgs& a, const ValidationTarget& target) {
  if (a.q.dtype != DType::kFloat8E4M3) return Status::ok();
  const char* where = on_device(target) ? " on the GPU" : " on this path";
  if (a.fp8.has_block_scales() && target.fp8_block_rows > 0 && a.fp8.block_rows != target.fp8_block_rows) {
    return unsupported(cat("block_rows: ", a.fp8.block_rows, " is not supported", where, "; its FP8 kernel reads one ",
                           "scale per ", target.fp8_block_rows, " rows"));
  }
  if (!target.supports_fp8) {
    return unsupported(std::string("q: dtype e4m3 (FP8) is not supported") + where + " yet" +
                       (on_device(target) ? ": the FP8 kernel does not exist (fa3::cpu::forward runs e4m3 inputs)"
                                          : ""));
  }
  if (a.varlen.enabled() && !target.supports_fp8_varlen) {
    return unsupported(std::string("q: e4m3 inputs in a varlen call are not supported") + where +
                       (on_device(target) ? " in this build (FA3_GPU_FP8_VARLEN; fa3::cpu::forward runs them)" : ""));
  }
  return Status::ok();
}

}  // namespace fa3
