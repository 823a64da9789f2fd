#include "hopper/varlen_rows.h"

#include <cmath>
#include <cstdint>
#include <string>

namespace fa3::hopper {
namespace {

constexpr int kThreads = 256;
// CTAs per range: enough to spread a long unused tail over the GPU, few enough that an
// empty range costs nothing to speak of.
constexpr int kCtasPerRange = 16;

// blockIdx.x = b < batch: sequence b's rows [cu_seqlens_q[b] + seqused_q[b],
// cu_seqlens_q[b + 1]) (none without seqused_q); b = batch: rows [cu_seqlens_q[batch],
// total_q). Out's elements are zeroed as 16-bit words, which is 0 in fp16 and bf16
// alike.
__global__ void __launch_bounds__(kThreads) clear_unused_rows_kernel(const __grid_constant__ FwdParams p) {
  const int b = blockIdx.x;
  int begin = 0;
  int end = 0;
  if (b < p.batch) {
    if (p.seqused_q == nullptr) return;
    begin = p.cu_seqlens_q[b] + p.seqused_q[b];
    end = p.cu_seqlens_q[b + 1];
  } else {
    begin = p.cu_seqlens_q[p.batch];
    end = p.total_q;
  }
  if (begin >= end) return;
  const std::int64_t per_row = static_cast<std::int64_t>(p.nheads_q) * p.head_dim_v;
  const std::int64_t count = (end - begin) * per_row;
  const std::int64_t step = static_cast<std::int64_t>(kThreads) * gridDim.y;
  std::uint16_t* out = static_cast<std::uint16_t*>(p.out);
  for (std::int64_t i = blockIdx.y * kThreads + threadIdx.x; i < count; i += step) {
    const std::int64_t row = begin + i / per_row;
    const std::int64_t head = i % per_row / p.head_dim_v;
    const std::int64_t col = i % p.head_dim_v;
    out[row * p.o_row_stride + head * p.o_head_stride + col] = 0;
  }
  if (p.lse == nullptr) return;
  const std::int64_t entries = static_cast<std::int64_t>(end - begin) * p.nheads_q;
  for (std::int64_t i = blockIdx.y * kThreads + threadIdx.x; i < entries; i += step) {
    const std::int64_t row = begin + i / p.nheads_q;
    const std::int64_t head = i % p.nheads_q;
    p.lse[head * p.lse_head_stride + row * p.lse_row_stride] = -INFINITY;
  }
}

// The rows of one packed tensor that take part in no sequence, as clear_unused_rows_kernel
// finds them: `cu` and `used` are its index tensors (cu_seqlens, seqused), `total` its
// rows.
struct UnusedRows {
  const int* cu;
  const int* used;
  int batch;
  int total;
  std::uint16_t* data;
  std::int64_t row_stride;
  std::int64_t head_stride;
  int heads;
  int cols;
};

// blockIdx.x as in clear_unused_rows_kernel; the tensor's elements zeroed as 16-bit words.
__global__ void __launch_bounds__(kThreads) clear_rows_kernel(const __grid_constant__ UnusedRows r) {
  const int b = blockIdx.x;
  int begin = 0;
  int end = 0;
  if (b < r.batch) {
    if (r.used == nullptr) return;
    begin = r.cu[b] + r.used[b];
    end = r.cu[b + 1];
  } else {
    begin = r.cu[r.batch];
    end = r.total;
  }
  if (begin >= end) return;
  const std::int64_t per_row = static_cast<std::int64_t>(r.heads) * r.cols;
  const std::int64_t count = (end - begin) * per_row;
  const std::int64_t step = static_cast<std::int64_t>(kThreads) * gridDim.y;
  for (std::int64_t i = blockIdx.y * kThreads + threadIdx.x; i < count; i += step) {
    const std::int64_t row = begin + i / per_row;
    const std::int64_t head = i % per_row / r.cols;
    const std::int64_t col = i % r.cols;
    r.data[row * r.row_stride + head * r.head_stride + col] = 0;
  }
}

}  // namespace

Status launch_clear_unused_grad_rows(const BwdParams& p, int element_bytes, cudaStream_t stream) {
  if (p.cu_seqlens_q == nullptr) return Status::ok();
  if (element_bytes != 2) {
    return {StatusCode::kInternal, "varlen: clearing unused rows takes 16-bit gradients, got " +
                                       std::to_string(element_bytes) + "-byte elements"};
  }
  const UnusedRows rows[] = {
      {p.cu_seqlens_q, p.seqused_q, p.batch, p.total_q, static_cast<std::uint16_t*>(p.dq), p.dq_row_stride,
       p.dq_head_stride, p.nheads_q, p.head_dim},
      {p.cu_seqlens_k, p.seqused_k, p.batch, p.total_k, static_cast<std::uint16_t*>(p.dk), p.dk_row_stride,
       p.dk_head_stride, p.nheads_kv, p.head_dim},
      {p.cu_seqlens_k, p.seqused_k, p.batch, p.total_k, static_cast<std::uint16_t*>(p.dv), p.dv_row_stride,
       p.dv_head_stride, p.nheads_kv, p.head_dim_v},
  };
  for (const UnusedRows& r : rows) {
    clear_rows_kernel<<<dim3(p.batch + 1, kCtasPerRange), kThreads, 0, stream>>>(r);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      return {StatusCode::kCudaError, std::string("varlen unused gradient rows launch: ") + cudaGetErrorString(err)};
    }
  }
  return Status::ok();
}

Status launch_clear_unused_rows(const FwdParams& p, int element_bytes, cudaStream_t stream) {
  if (p.cu_seqlens_q == nullptr) return Status::ok();
  if (element_bytes != 2) {
    return {StatusCode::kInternal, "varlen: clearing unused rows takes 16-bit outputs, got " +
                                       std::to_string(element_bytes) + "-byte elements"};
  }
  clear_unused_rows_kernel<<<dim3(p.batch + 1, kCtasPerRange), kThreads, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::ok();
  return {StatusCode::kCudaError, std::string("varlen unused rows launch: ") + cudaGetErrorString(err)};
}

}  // namespace fa3::hopper
