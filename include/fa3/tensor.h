// fa3 — non-owning views of tensors handed to the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace fa3 {

enum class DType : std::uint8_t {
  kFloat16,
  kBFloat16,
  kFloat8E4M3,
  kFloat32,
  kInt32,  // index tensors only (cu_seqlens, seqused)
};

const char* dtype_name(DType dtype);  // "fp16", "bf16", "e4m3", "fp32", "int32"
std::size_t dtype_size(DType dtype);  // bytes per element

// A strided view of memory the caller owns. Shapes and strides are in elements;
// strides are 64-bit so that tensors over 2^31 elements can be addressed.
struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::kBFloat16;
  int rank = 0;
  std::int64_t shape[kMaxRank] = {};
  std::int64_t stride[kMaxRank] = {};

  // Row-major (last dimension contiguous) view of `shape`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape);
  // View with explicit strides; `shape` and `stride` must have the same length.
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> stride);

  bool defined() const { return data != nullptr; }
  std::int64_t numel() const;
  // Byte offset of the element at `index` (rank entries) from `data`.
  std::int64_t byte_offset(const std::int64_t* index) const;
};

}  // namespace fa3
