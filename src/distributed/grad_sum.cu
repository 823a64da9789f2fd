#include "distributed/grad_sum.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace fa3::distributed::detail {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill the GPU several times over; larger tensors loop.
constexpr std::int64_t kMaxBlocks = 4096;

enum class Op { kCopy, kAdd, kWrite };

// Both views' shape, and each one's strides (elements) of the first three dimensions.
struct Geometry {
  std::int64_t shape[4];
  std::int64_t sum_stride[3], grad_stride[3];
};

__device__ float to_float(__half x) { return __half2float(x); }
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ T from_float(float x);
template <>
__device__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// kVec elements of a gradient, moved as one access (16 bytes when kVec is 8).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Stores of 16 bytes go through __stwb, an ordinary (write-back) store: plain vector
// stores through this kernel's computed addresses were compiled into 4- and 2-byte ones.
template <class T, int kVec>
__device__ void store_pack(T* p, const Pack<T, kVec>& pack) {
  if constexpr (sizeof(pack) == sizeof(uint4)) {
    uint4 bits;
    memcpy(&bits, &pack, sizeof(bits));
    __stwb(reinterpret_cast<uint4*>(p), bits);
  } else {
    *reinterpret_cast<Pack<T, kVec>*>(p) = pack;
  }
}

// kVec fp32 values, in 16-byte accesses where kVec is a multiple of 4.
template <int kVec>
__device__ void load_floats(const float* p, float (&v)[kVec]) {
  if constexpr (kVec % 4 == 0) {
    for (int j = 0; j < kVec / 4; ++j) {
      const float4 x = reinterpret_cast<const float4*>(p)[j];
      v[4 * j] = x.x, v[4 * j + 1] = x.y, v[4 * j + 2] = x.z, v[4 * j + 3] = x.w;
    }
  } else {
    for (int j = 0; j < kVec; ++j) v[j] = p[j];
  }
}

template <int kVec>
__device__ void store_floats(float* p, const float (&v)[kVec]) {
  if constexpr (kVec % 4 == 0) {
    for (int j = 0; j < kVec / 4; ++j) {
      __stwb(reinterpret_cast<float4*>(p) + j, make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]));
    }
  } else {
    for (int j = 0; j < kVec; ++j) p[j] = v[j];
  }
}

// One thread per kVec consecutive elements of the last dimension, grid-stride.
template <class T, int kVec, Op kOp>
__global__ void __launch_bounds__(kThreads) grad_sum_kernel(float* sum, T* grad, Geometry g) {
  const std::int64_t per_row = g.shape[3] / kVec;
  const std::int64_t vectors = g.shape[0] * g.shape[1] * g.shape[2] * per_row;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x; i < vectors;
       i += static_cast<std::int64_t>(gridDim.x) * kThreads) {
    std::int64_t rest = i / per_row;
    const std::int64_t col = (i - rest * per_row) * kVec;
    const std::int64_t i2 = rest % g.shape[2];
    rest /= g.shape[2];
    const std::int64_t i1 = rest % g.shape[1], i0 = rest / g.shape[1];
    float* s = sum + i0 * g.sum_stride[0] + i1 * g.sum_stride[1] + i2 * g.sum_stride[2] + col;
    T* d = grad + i0 * g.grad_stride[0] + i1 * g.grad_stride[1] + i2 * g.grad_stride[2] + col;
    float v[kVec];
    if constexpr (kOp == Op::kWrite) {
      load_floats(s, v);
      Pack<T, kVec> out;
      for (int j = 0; j < kVec; ++j) out.v[j] = from_float<T>(v[j]);
      store_pack(d, out);
    } else {
      const Pack<T, kVec> in = *reinterpret_cast<const Pack<T, kVec>*>(d);
      for (int j = 0; j < kVec; ++j) v[j] = to_float(in.v[j]);
      if constexpr (kOp == Op::kAdd) {
        float before[kVec];
        load_floats(s, before);
        for (int j = 0; j < kVec; ++j) v[j] = before[j] + v[j];
      }
      store_floats(s, v);
    }
  }
}

// Whether every access of kVec elements is aligned: rows whole numbers of vectors, each
// starting 16 bytes aligned in both views.
bool vectorizable(const TensorView& sum, const TensorView& grad, int vec) {
  if (sum.shape[3] % vec != 0) return false;
  for (const TensorView* t : {&sum, &grad}) {
    if (reinterpret_cast<std::uintptr_t>(t->data) % 16 != 0) return false;
    for (int d = 0; d < 3; ++d) {
      if (t->stride[d] % vec != 0) return false;
    }
  }
  return true;
}

template <class T, Op kOp>
void launch(const TensorView& sum, const TensorView& grad, cudaStream_t stream) {
  Geometry g{};
  for (int d = 0; d < 4; ++d) g.shape[d] = sum.shape[d];
  for (int d = 0; d < 3; ++d) {
    g.sum_stride[d] = sum.stride[d];
    g.grad_stride[d] = grad.stride[d];
  }
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = vectorizable(sum, grad, kVec);
  const std::int64_t vectors = sum.numel() / (vec ? kVec : 1);
  const auto blocks = static_cast<unsigned>(std::min(kMaxBlocks, (vectors + kThreads - 1) / kThreads));
  auto* s = static_cast<float*>(sum.data);
  auto* d = static_cast<T*>(grad.data);
  if (vec) {
    grad_sum_kernel<T, kVec, kOp><<<blocks, kThreads, 0, stream>>>(s, d, g);
  } else {
    grad_sum_kernel<T, 1, kOp><<<blocks, kThreads, 0, stream>>>(s, d, g);
  }
}

template <Op kOp>
Status run(const TensorView& sum, const TensorView& grad, cudaStream_t stream, const char* what) {
  if (sum.numel() == 0) return Status::ok();
  switch (grad.dtype) {
    case DType::kFloat16: launch<__half, kOp>(sum, grad, stream); break;
    case DType::kBFloat16: launch<__nv_bfloat16, kOp>(sum, grad, stream); break;
    default:
      return {StatusCode::kNotSupported,
              std::string(what) + ": gradients of dtype " + dtype_name(grad.dtype) + " have no sum kernel"};
  }
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::ok();
  return {StatusCode::kCudaError, std::string(what) + " launch: " + cudaGetErrorString(err)};
}

}  // namespace

Status add_gradient(const TensorView& sum, const TensorView& grad, bool first, cudaStream_t stream) {
  return first ? run<Op::kCopy>(sum, grad, stream, "gradient sum") : run<Op::kAdd>(sum, grad, stream, "gradient sum");
}

Status write_gradient(const TensorView& sum, const TensorView& grad, cudaStream_t stream) {
  return run<Op::kWrite>(sum, grad, stream, "gradient write");
}

}  // namespace fa3::distributed::detail
