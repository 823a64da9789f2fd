#include "fa3/tensor.h"

#include <stdexcept>

namespace fa3 {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat8E4M3: return "e4m3";
    case DType::kFloat32: return "fp32";
    case DType::kInt32: return "int32";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat8E4M3: return 1;
    case DType::kFloat32:
    case DType::kInt32: return 4;
  }
  return 0;
}

namespace {

// A view of `shape` with unset strides; throws when the rank is over kMaxRank.
TensorView with_shape(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  if (shape.size() > static_cast<std::size_t>(TensorView::kMaxRank)) {
    throw std::invalid_argument("TensorView: rank over 4");
  }
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  int i = 0;
  for (std::int64_t s : shape) t.shape[i++] = s;
  return t;
}

}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  TensorView t = with_shape(data, dtype, shape);
  std::int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> stride) {
  if (shape.size() != stride.size()) {
    throw std::invalid_argument("TensorView: shape and stride must have the same length");
  }
  TensorView t = with_shape(data, dtype, shape);
  int i = 0;
  for (std::int64_t s : stride) t.stride[i++] = s;
  return t;
}

std::int64_t TensorView::numel() const {
  if (rank == 0) return 0;
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

std::int64_t TensorView::byte_offset(const std::int64_t* index) const {
  std::int64_t off = 0;
  for (int d = 0; d < rank; ++d) off += index[d] * stride[d];
  return off * static_cast<std::int64_t>(dtype_size(dtype));
}

}  // namespace fa3
