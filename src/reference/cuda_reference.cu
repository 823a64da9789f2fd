#include "reference/cuda_reference.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>

namespace fa3::reference {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDimPerLane = 8;  // head dims up to 256 over 32 lanes

struct View {
  const void* data;
  long long batch_stride, row_stride, head_stride;
};

View make_view(const TensorView& t) { return {t.data, t.stride[0], t.stride[1], t.stride[2]}; }

struct Args {
  View q, k, v;
  float* out;
  float* lse;
  int batch, seqlen_q, seqlen_k, nheads_q, nheads_kv, head_dim;
  float scale, softcap;
  long long window_left, window_right;
  bool round_like_inputs;
};

template <class T>
__device__ float load(const void* base, long long i) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  } else {
    return __half2float(static_cast<const __half*>(base)[i]);
  }
}

template <class T>
__device__ float round_like(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__float2bfloat16_rn(x));
  } else {
    return __half2float(__float2half_rn(x));
  }
}

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The score of (query row i, key j) as the kernels define it, or -inf when masked.
template <class T>
__device__ float score(const Args& a, const float (&q)[kMaxDimPerLane], int b, int hk, int i, int j) {
  const long long diag = static_cast<long long>(i) + a.seqlen_k - a.seqlen_q;
  if ((a.window_left >= 0 && j < diag - a.window_left) || (a.window_right >= 0 && j > diag + a.window_right)) {
    return -INFINITY;
  }
  const int lane = threadIdx.x % 32;
  const long long base = b * a.k.batch_stride + j * a.k.row_stride + hk * a.k.head_stride;
  float dot = 0.f;
  for (int e = 0; e < kMaxDimPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < a.head_dim) dot += q[e] * load<T>(a.k.data, base + d);
  }
  float s = warp_sum(dot);
  if (a.round_like_inputs) s = round_like<T>(s);
  s *= a.scale;
  if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
  return s;
}

// One warp per (batch, head, query row); two passes over the keys (statistics, then
// output), which is what a naive implementation computes, so the "like inputs" mode
// can round the normalized probabilities exactly where such an implementation would.
template <class T>
__global__ void reference_forward_kernel(Args a) {
  const long long row_id = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const long long rows = static_cast<long long>(a.batch) * a.nheads_q * a.seqlen_q;
  if (row_id >= rows) return;
  const int lane = threadIdx.x % 32;
  const int i = static_cast<int>(row_id % a.seqlen_q);
  const int h = static_cast<int>((row_id / a.seqlen_q) % a.nheads_q);
  const int b = static_cast<int>(row_id / (static_cast<long long>(a.seqlen_q) * a.nheads_q));
  const int hk = h / (a.nheads_q / a.nheads_kv);

  float q[kMaxDimPerLane];
  const long long q_base = b * a.q.batch_stride + i * a.q.row_stride + h * a.q.head_stride;
  for (int e = 0; e < kMaxDimPerLane; ++e) {
    const int d = lane + 32 * e;
    q[e] = d < a.head_dim ? load<T>(a.q.data, q_base + d) : 0.f;
  }

  float m = -INFINITY;
  for (int j = 0; j < a.seqlen_k; ++j) m = fmaxf(m, score<T>(a, q, b, hk, i, j));
  float sum = 0.f;
  if (m != -INFINITY) {
    for (int j = 0; j < a.seqlen_k; ++j) sum += expf(score<T>(a, q, b, hk, i, j) - m);
  }

  float o[kMaxDimPerLane] = {};
  if (sum > 0.f) {
    for (int j = 0; j < a.seqlen_k; ++j) {
      float p = expf(score<T>(a, q, b, hk, i, j) - m) / sum;
      if (a.round_like_inputs) p = round_like<T>(p);
      if (p == 0.f) continue;
      const long long v_base = b * a.v.batch_stride + j * a.v.row_stride + hk * a.v.head_stride;
      for (int e = 0; e < kMaxDimPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < a.head_dim) o[e] += p * load<T>(a.v.data, v_base + d);
      }
    }
  }
  const long long o_base = ((static_cast<long long>(b) * a.seqlen_q + i) * a.nheads_q + h) * a.head_dim;
  for (int e = 0; e < kMaxDimPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < a.head_dim) a.out[o_base + d] = a.round_like_inputs ? round_like<T>(o[e]) : o[e];
  }
  if (a.lse != nullptr && lane == 0) {
    a.lse[(static_cast<long long>(b) * a.nheads_q + h) * a.seqlen_q + i] = sum > 0.f ? m + logf(sum) : -INFINITY;
  }
}

}  // namespace

Status cuda_forward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v, float* out,
                    float* lse, Precision precision, cudaStream_t stream) {
  if (p.head_dim > 32 * kMaxDimPerLane) {
    return {StatusCode::kNotSupported, "CUDA reference: head dim over " + std::to_string(32 * kMaxDimPerLane)};
  }
  Args a{make_view(q),
         make_view(k),
         make_view(v),
         out,
         lse,
         static_cast<int>(p.batch),
         static_cast<int>(p.seqlen_q),
         static_cast<int>(p.seqlen_k),
         static_cast<int>(p.nheads_q),
         static_cast<int>(p.nheads_kv),
         static_cast<int>(p.head_dim),
         p.softmax_scale,
         p.softcap,
         p.window_left,
         p.window_right,
         precision == Precision::kLikeInputs};
  const long long rows = p.batch * p.nheads_q * p.seqlen_q;
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const unsigned threads = 32 * kWarpsPerBlock;
  switch (q.dtype) {
    case DType::kBFloat16: reference_forward_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(a); break;
    case DType::kFloat16: reference_forward_kernel<__half><<<blocks, threads, 0, stream>>>(a); break;
    case DType::kFloat32: reference_forward_kernel<float><<<blocks, threads, 0, stream>>>(a); break;
    default: return {StatusCode::kNotSupported, "CUDA reference: unsupported dtype"};
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return {StatusCode::kCudaError, std::string("CUDA reference launch: ") + cudaGetErrorString(err)};
  return Status::ok();
}

}  // namespace fa3::reference
