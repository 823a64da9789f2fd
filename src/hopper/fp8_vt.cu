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

struct TransposeArgs {
  const std::uint8_t* v;
  std::int64_t batch_stride, row_stride, head_stride, col_stride;
  std::uint8_t* vt;
  const int* cu_seqlens_k;  // a varlen call's, else null
  const int* seqused_k;     // may be null
  int seqlen_k;             // a fixed-length call's
  int vt_keys;
  int head_dim;
  int nheads_kv;
};

// What one (batch, kv head) reads and writes: V's rows from src, keys of them (the
// columns past those are zeros), into Vᵀ's rows from dst, `columns` of each.
struct Segment {
  const std::uint8_t* src;
  std::uint8_t* dst;
  int keys;
  int columns;
};

__device__ Segment segment(const TransposeArgs& a, int batch, int head) {
  if (a.cu_seqlens_k == nullptr) {
    return {a.v + batch * a.batch_stride + head * a.head_stride,
            a.vt + (static_cast<std::int64_t>(batch) * a.nheads_kv + head) * a.head_dim * a.vt_keys, a.seqlen_k,
            a.vt_keys};
  }
  const int offset = a.cu_seqlens_k[batch];
  const int keys = a.seqused_k != nullptr ? a.seqused_k[batch] : a.cu_seqlens_k[batch + 1] - offset;
  return {a.v + offset * a.row_stride + head * a.head_stride,
          a.vt + static_cast<std::int64_t>(head) * a.head_dim * a.vt_keys + fp8_vt_seq_start(offset, batch), keys,
          keys + kFp8VtTail};
}

__global__ void __launch_bounds__(kThreads) transpose_v(const TransposeArgs a) {
  __shared__ std::uint8_t tile[kTile][kTile + 4];
  const int head = static_cast<int>(blockIdx.x) % a.nheads_kv;
  const int batch = static_cast<int>(blockIdx.x) / a.nheads_kv;
  const Segment seg = segment(a, batch, head);
  const int key0 = blockIdx.y * kTile;
  const int col0 = blockIdx.z * kTile;
  if (key0 >= seg.columns) return;  // a varlen grid covers its longest sequence
  // Neighbouring threads read neighbouring bytes: along the head dim, or along the keys
  // of a v whose keys are contiguous.
  const bool keys_inner = a.col_stride != 1;
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int k = keys_inner ? i % kTile : i / kTile, c = keys_inner ? i / kTile : i % kTile;
    const int key = key0 + k, col = col0 + c;
    tile[k][c] = key < seg.keys && col < a.head_dim ? seg.src[key * a.row_stride + col * a.col_stride] : std::uint8_t{0};
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int k = i % kTile, col = col0 + i / kTile;
    const int key = k / 16 * 16 + fp8_vt_key(k % 16);
    if (col < a.head_dim && key0 + k < seg.columns) {
      seg.dst[static_cast<std::int64_t>(col) * a.vt_keys + key0 + k] = tile[key][i / kTile];
    }
  }
}

std::int64_t round_up(std::int64_t n, std::int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

int fp8_vt_keys(int seqlen_k) { return static_cast<int>(round_up(seqlen_k, kFp8VtKeyAlign)); }

std::int64_t fp8_vt_varlen_keys(std::int64_t total_k, std::int64_t batch) {
  // Sequence b ends before fp8_vt_seq_start(cu_seqlens_k[b + 1], b + 1), at most that of
  // (total_k, batch).
  return round_up(fp8_vt_seq_start(total_k, batch), kFp8VtKeyAlign);
}

std::int64_t fp8_vt_keys(const Problem& p) {
  return p.varlen ? fp8_vt_varlen_keys(p.total_k, p.batch) : fp8_vt_keys(static_cast<int>(p.seqlen_k));
}

std::size_t fp8_vt_bytes(const Problem& p) {
  const std::int64_t entries = p.varlen ? 1 : p.batch;
  return static_cast<std::size_t>(entries) * static_cast<std::size_t>(p.nheads_kv) *
         static_cast<std::size_t>(p.head_dim_v) * static_cast<std::size_t>(fp8_vt_keys(p));
}

cudaError_t launch_fp8_transpose_v(const FwdParams& p, void* vt, cudaStream_t stream) {
  const bool varlen = p.cu_seqlens_k != nullptr;
  const TransposeArgs args{static_cast<const std::uint8_t*>(p.v),
                           p.v_batch_stride,
                           p.v_row_stride,
                           p.v_head_stride,
                           p.v_col_stride,
                           static_cast<std::uint8_t*>(vt),
                           p.cu_seqlens_k,
                           p.seqused_k,
                           p.seqlen_k,
                           p.vt_keys,
                           p.head_dim_v,
                           p.nheads_kv};
  // A fixed-length call writes every key of Vᵀ; a varlen one each sequence's used keys
  // and the zeros after them, the grid sized for the longest (max_seqlen_k, p.seqlen_k).
  const int keys =
      varlen ? static_cast<int>(round_up(static_cast<std::int64_t>(p.seqlen_k) + kFp8VtTail, kTile)) : p.vt_keys;
  // (batch, head) pairs on x, whose limit is 2^31 - 1; keys on y (65535 tiles: 4M keys).
  const dim3 grid(p.batch * p.nheads_kv, keys / kTile, (p.head_dim_v + kTile - 1) / kTile);
  transpose_v<<<grid, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace fa3::hopper
