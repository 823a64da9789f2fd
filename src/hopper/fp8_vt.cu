// The transpose of hopper/fp8_vt.h: a CTA moves a 64-key x 64-column tile of one (batch,
// kv head) through shared memory, reading V's rows and writing Vᵀ's, both a byte per
// thread in consecutive addresses (coalesced).
#include <cstdint>

#include "hopper/fp8_layout.h"
#include "hopper/fp8_vt.h"

namespace fa3::hopper {
namespace {

constexpr int kTile = 64;
constexpr int kThreads = 256;
static_assert(kTile % 16 == 0 && kFp8VtKeyAlign % kTile == 0, "tiles hold whole permutation groups");

__global__ void __launch_bounds__(kThreads)
    transpose_v(const std::uint8_t* v, std::int64_t batch_stride, std::int64_t row_stride, std::int64_t head_stride,
                std::uint8_t* vt, int seqlen_k, int vt_keys, int head_dim, int nheads_kv) {
  __shared__ std::uint8_t tile[kTile][kTile + 4];
  const int head = static_cast<int>(blockIdx.x) % nheads_kv;
  const int batch = static_cast<int>(blockIdx.x) / nheads_kv;
  const int key0 = blockIdx.y * kTile;
  const int col0 = blockIdx.z * kTile;
  const std::uint8_t* src = v + batch * batch_stride + head * head_stride;
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int key = key0 + i / kTile, col = col0 + i % kTile;
    tile[i / kTile][i % kTile] = key < seqlen_k && col < head_dim ? src[key * row_stride + col] : std::uint8_t{0};
  }
  __syncthreads();
  std::uint8_t* dst = vt + (static_cast<std::int64_t>(batch) * nheads_kv + head) * head_dim * vt_keys;
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int k = i % kTile, col = col0 + i / kTile;
    const int key = k / 16 * 16 + fp8_vt_key(k % 16);
    if (col < head_dim) dst[static_cast<std::int64_t>(col) * vt_keys + key0 + k] = tile[key][i / kTile];
  }
}

}  // namespace

int fp8_vt_keys(int seqlen_k) { return (seqlen_k + kFp8VtKeyAlign - 1) / kFp8VtKeyAlign * kFp8VtKeyAlign; }

std::size_t fp8_vt_bytes(const Problem& p) {
  return static_cast<std::size_t>(p.batch) * static_cast<std::size_t>(p.nheads_kv) *
         static_cast<std::size_t>(p.head_dim_v) * static_cast<std::size_t>(fp8_vt_keys(static_cast<int>(p.seqlen_k)));
}

cudaError_t launch_fp8_transpose_v(const FwdParams& p, void* vt, cudaStream_t stream) {
  const int keys = fp8_vt_keys(p.seqlen_k);
  // (batch, head) pairs on x, whose limit is 2^31 - 1; keys on y (65535 tiles: 4M keys).
  const dim3 grid(p.batch * p.nheads_kv, keys / kTile, (p.head_dim_v + kTile - 1) / kTile);
  transpose_v<<<grid, kThreads, 0, stream>>>(static_cast<const std::uint8_t*>(p.v), p.v_batch_stride, p.v_row_stride,
                                             p.v_head_stride, static_cast<std::uint8_t*>(vt), p.seqlen_k, keys,
                                             p.head_dim_v, p.nheads_kv);
  return cudaGetLastError();
}

}  // namespace fa3::hopper
