#include "hopper/kvcache_append.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "hopper/convert.cuh"
#include "hopper/kvcache_kernel.cuh"
#include "common/status_macros.h"
#include "hopper/launch_util.h"

namespace fa3::hopper {
namespace {

constexpr int kAppendThreads = 256;

// Column d of a row after the rotary embedding at table row `pos`: a pair rotated by
// angle pos, as (x[2i], x[2i + 1]) when interleaved or (x[i], x[i + rotary_dim / 2]),
// computed as fa3::cpu does (x0·c − x1·s, x0·s + x1·c in fp32, never fused, so that
// both give the same rounded value); columns past rotary_dim are copied.
template <class T>
__device__ T rotated(const T* row, int d, const KvAppendParams& p, std::int64_t pos) {
  if (d >= p.rotary_dim) return row[d];
  const int half = p.rotary_dim / 2;
  const int i = p.interleaved ? d / 2 : d % half;
  const bool first = p.interleaved ? d % 2 == 0 : d < half;
  const float x0 = to_float(row[p.interleaved ? 2 * i : i]);
  const float x1 = to_float(row[p.interleaved ? 2 * i + 1 : i + half]);
  const float c = to_float(static_cast<const T*>(p.rotary_cos)[pos * p.cos_stride + i]);
  const float s = to_float(static_cast<const T*>(p.rotary_sin)[pos * p.sin_stride + i]);
  const float r = first ? __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)) : __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  return from_float<T>(r);
}

__device__ std::int64_t rotary_position(const KvAppendParams& p, int b) {
  return p.rotary_seqlens != nullptr ? p.rotary_seqlens[b] : p.index.seqlens[b];
}

// One thread per value of k_new and v_new: row (b, i, h) goes to cache position
// cache_seqlens[b] + i, k_new's rotated when the call has a rotary embedding.
template <class T>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const __grid_constant__ KvAppendParams p) {
  const std::int64_t k_values = static_cast<std::int64_t>(p.batch) * p.index.seqlen_new * p.nheads_kv * p.head_dim;
  const std::int64_t v_values = static_cast<std::int64_t>(p.batch) * p.index.seqlen_new * p.nheads_kv * p.head_dim_v;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < k_values + v_values;
       n += step) {
    const bool is_k = n < k_values;
    const int dim = is_k ? p.head_dim : p.head_dim_v;
    std::int64_t rest = is_k ? n : n - k_values;
    const int d = static_cast<int>(rest % dim);
    rest /= dim;
    const int h = static_cast<int>(rest % p.nheads_kv);
    rest /= p.nheads_kv;
    const int i = static_cast<int>(rest % p.index.seqlen_new);
    const int b = static_cast<int>(rest / p.index.seqlen_new);
    const RowsTensor& src = is_k ? p.k_new : p.v_new;
    const T* row = static_cast<const T*>(src.data) + b * src.stride[0] + static_cast<std::int64_t>(i) * src.stride[1] +
                   h * src.stride[2];
    const int cache_row = p.index.batch_idx != nullptr ? p.index.batch_idx[b] : b;
    const int pos = p.index.seqlens[b] + i;
    const CacheTensor& cache = is_k ? p.k : p.v;
    const kvcache_detail::CacheRow at = kvcache_detail::cache_row_of(p.index, b, cache_row, pos);
    T* dst = kvcache_detail::row_address<T>(cache, at, h) + d;
    if constexpr (std::is_same_v<T, std::uint8_t>) {
      *dst = row[d];  // e4m3 codes: copied as they are (no rotary embedding, fa3/kvcache.h)
    } else {
      *dst = is_k && p.rotary_dim > 0 ? rotated(row, d, p, rotary_position(p, b) + i) : row[d];
    }
  }
}

// One thread per value of q: its rotated copy, query row i at position pos + i when the
// queries are the new tokens (causal or windowed calls), else pos.
template <class T>
__global__ void __launch_bounds__(kAppendThreads) rotate_q_kernel(const __grid_constant__ KvAppendParams p) {
  const std::int64_t values = static_cast<std::int64_t>(p.batch) * p.seqlen_q * p.nheads_q * p.head_dim;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < values; n += step) {
    std::int64_t rest = n;
    const int d = static_cast<int>(rest % p.head_dim);
    rest /= p.head_dim;
    const int h = static_cast<int>(rest % p.nheads_q);
    rest /= p.nheads_q;
    const int i = static_cast<int>(rest % p.seqlen_q);
    const int b = static_cast<int>(rest / p.seqlen_q);
    const T* row = static_cast<const T*>(p.q.data) + b * p.q.stride[0] + static_cast<std::int64_t>(i) * p.q.stride[1] +
                   h * p.q.stride[2];
    T* dst = static_cast<T*>(p.q_rotated.data) + b * p.q_rotated.stride[0] +
             static_cast<std::int64_t>(i) * p.q_rotated.stride[1] + h * p.q_rotated.stride[2] + d;
    *dst = rotated(row, d, p, rotary_position(p, b) + (p.q_per_row ? i : 0));
  }
}

// Enough blocks to cover `values` once, capped: the kernels stride over the rest.
unsigned blocks_for(std::int64_t values) {
  const std::int64_t blocks = (values + kAppendThreads - 1) / kAppendThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

template <class T>
Status launch_typed(const KvAppendParams& p, cudaStream_t stream) {
  const std::int64_t appended =
      static_cast<std::int64_t>(p.batch) * p.index.seqlen_new * p.nheads_kv * (p.head_dim + p.head_dim_v);
  if (appended > 0) {
    append_kernel<T><<<blocks_for(appended), kAppendThreads, 0, stream>>>(p);
    FA3_RETURN_IF_ERROR(detail::cuda_status(cudaGetLastError(), "KV-cache append kernel launch"));
  }
  if constexpr (!std::is_same_v<T, std::uint8_t>) {
    if (p.rotary_dim > 0) {
      const std::int64_t values = static_cast<std::int64_t>(p.batch) * p.seqlen_q * p.nheads_q * p.head_dim;
      rotate_q_kernel<T><<<blocks_for(values), kAppendThreads, 0, stream>>>(p);
      FA3_RETURN_IF_ERROR(detail::cuda_status(cudaGetLastError(), "KV-cache rotary kernel launch"));
    }
  }
  return Status::ok();
}

}  // namespace

Status launch_kvcache_append(const KvAppendParams& p, DType dtype, cudaStream_t stream) {
  if (dtype == DType::kBFloat16) return launch_typed<__nv_bfloat16>(p, stream);
  if (dtype == DType::kFloat16) return launch_typed<__half>(p, stream);
  if (dtype == DType::kFloat8E4M3) return launch_typed<std::uint8_t>(p, stream);
  return {StatusCode::kInternal, "KV-cache append: q's dtype passed validation but has no kernel"};
}

}  // namespace fa3::hopper
