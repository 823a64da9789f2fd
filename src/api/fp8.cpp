// fa3/fp8.h's entry points: the rules of a quantize call, then the CPU version or the
// GPU kernel.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <string>

#include "api/validate.h"
#include "api/validate_messages.h"
#include "api/validate_varlen.h"
#include "common/hadamard.h"
#include "common/status_macros.h"
#include "fa3/device.h"
#include "fa3/fp8.h"
#include "hopper/fp8_quantize.h"
#include "reference/fp8_quantize.h"

namespace fa3 {
namespace {

using detail::cat;
using detail::invalid;
using detail::shape_string;
using detail::unsupported;

constexpr int kMaxHeadDim = 256;  // the kernel's registers: 8 columns per lane

// input or output: (batch, seqlen, nheads, head_dim), or a varlen call's (total, nheads,
// head_dim).
Status check_rows(const char* name, const TensorView& t, bool packed) {
  const std::string n = name;
  const int rank = packed ? 3 : 4;
  if (t.data == nullptr) return invalid(n + ": data pointer is null");
  if (t.rank != rank) {
    return invalid(cat(n, ": expected a ", rank, "-d tensor ",
                       packed ? "(total, nheads, head_dim)" : "(batch, seqlen, nheads, head_dim)", ", got rank ",
                       t.rank));
  }
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] < 1) return invalid(cat(n, ": dim ", d, " must be >= 1, got ", t.shape[d]));
    if (t.stride[d] < 0) return invalid(cat(n, ": stride of dim ", d, " must be >= 0, got ", t.stride[d]));
  }
  if (t.stride[rank - 1] != 1) {
    return invalid(cat(n, ": last dimension must be contiguous (stride 1), got stride ", t.stride[rank - 1]));
  }
  return Status::ok();
}

// Every rule of fa3/fp8.h's QuantizeArgs on `target` (the device's: pointers checked
// with its locate; the host's: a varlen call's offsets read).
Status validate_quantize(const fp8::QuantizeArgs& a, const ValidationTarget& target) {
  const bool packed = a.cu_seqlens.defined();
  FA3_RETURN_IF_ERROR(check_rows("input", a.input, packed));
  FA3_RETURN_IF_ERROR(check_rows("output", a.output, packed));
  const DType in = a.input.dtype;
  if (in != DType::kFloat32 && in != DType::kFloat16 && in != DType::kBFloat16) {
    return invalid(std::string("input: dtype must be fp32, fp16 or bf16, got ") + dtype_name(in));
  }
  if (a.output.dtype != DType::kFloat8E4M3) {
    return invalid(std::string("output: dtype must be e4m3, got ") + dtype_name(a.output.dtype));
  }
  for (int d = 0; d < a.input.rank; ++d) {
    if (a.output.shape[d] != a.input.shape[d]) {
      return invalid("output: shape " + shape_string(a.output) + " must equal input's shape " +
                     shape_string(a.input));
    }
  }
  if (packed) {
    FA3_RETURN_IF_ERROR(
        check_sequence_offsets("cu_seqlens", a.cu_seqlens, a.max_seqlen, a.input.shape[0], "input", target));
  } else if (a.max_seqlen != 0) {
    return invalid(cat("max_seqlen: ", a.max_seqlen, " given without cu_seqlens (it belongs to a varlen call)"));
  }
  if (a.block_rows < 1) return invalid(cat("block_rows must be >= 1, got ", a.block_rows));
  const std::int64_t batch = packed ? a.cu_seqlens.shape[0] - 1 : a.input.shape[0];
  const std::int64_t heads = a.input.shape[packed ? 1 : 2];
  const std::int64_t blocks = ((packed ? a.max_seqlen : a.input.shape[1]) + a.block_rows - 1) / a.block_rows;
  const TensorView& s = a.scale;
  if (s.data == nullptr) return invalid("scale: data pointer is null");
  if (s.rank != 3) return invalid(cat("scale: expected a 3-d tensor (batch, nheads, blocks), got rank ", s.rank));
  if (s.dtype != DType::kFloat32) return invalid(std::string("scale: dtype must be fp32, got ") + dtype_name(s.dtype));
  if (s.shape[0] != batch || s.shape[1] != heads || s.shape[2] != blocks) {
    return invalid(cat("scale: shape ", shape_string(s), " must be (batch, nheads, ceil(",
                       packed ? "max_seqlen" : "seqlen", " / block_rows)) = (", batch, ", ", heads, ", ", blocks, ")"));
  }
  for (int d = 0; d < 3; ++d) {
    if (s.stride[d] < 0) return invalid(cat("scale: stride of dim ", d, " must be >= 0, got ", s.stride[d]));
  }
  const std::int64_t head_dim = a.input.shape[a.input.rank - 1];
  if (head_dim > kMaxHeadDim) {
    return unsupported(cat("input: head dim ", head_dim, " is not supported; supported: 1 to ", kMaxHeadDim));
  }
  if (a.hadamard && head_dim % 32 != 0) {
    return invalid(cat("input: head dim ", head_dim,
                       " is not a multiple of 32, as the Hadamard transform needs (hadamard=false quantizes it)"));
  }
  const char* names[] = {"input", "output", "scale"};
  const TensorView* views[] = {&a.input, &a.output, &a.scale};
  for (int i = 0; i < 3; ++i) {
    if (reinterpret_cast<std::uintptr_t>(views[i]->data) % dtype_size(views[i]->dtype) != 0) {
      return invalid(std::string(names[i]) + ": data pointer is not aligned to its element size");
    }
    const std::string where = target.locate ? target.locate(views[i]->data) : std::string();
    if (!where.empty()) return invalid(std::string(names[i]) + ": pointer is " + where + ", not memory of the current CUDA device");
  }
  return Status::ok();
}

ValidationTarget quantize_target(ValidationTarget::Space space) {
  ValidationTarget t;
  t.space = space;
  if (space == ValidationTarget::Space::kDevice) t.locate = locate_device_pointer;
  return t;
}

}  // namespace

namespace fp8 {

int hadamard_size(int head_dim) { return hadamard::block_size(head_dim); }

bool hadamard_sign(std::uint64_t seed, int column) { return hadamard::negative(seed, column); }

Status quantize(const QuantizeArgs& args, cudaStream_t stream) {
  FA3_RETURN_IF_ERROR(validate_quantize(args, quantize_target(ValidationTarget::Space::kDevice)));
  const cudaError_t err = hopper::launch_fp8_quantize(args, stream);
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("fa3::fp8::quantize: ") + cudaGetErrorString(err)};
  }
  return Status::ok();
}

}  // namespace fp8

namespace cpu {

Status quantize(const fp8::QuantizeArgs& args) {
  FA3_RETURN_IF_ERROR(validate_quantize(args, quantize_target(ValidationTarget::Space::kHost)));
  try {
    reference::fp8_quantize(args);
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, std::string("fa3::cpu::quantize: ") + e.what()};
  }
  return Status::ok();
}

}  // namespace cpu
}  // namespace fa3
