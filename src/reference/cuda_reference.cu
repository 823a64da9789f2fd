#include "reference/cuda_reference.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>
#include <type_traits>

namespace fa3::reference {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDimPerLane = 8;    // q and k head dims up to 256 over 32 lanes
constexpr int kMaxVDimPerLane = 16;  // v head dims up to 512

struct View {
  const void* data;
  long long batch_stride, row_stride, head_stride;
};

View make_view(const TensorView& t) { return {t.data, t.stride[0], t.stride[1], t.stride[2]}; }

__device__ long long offset(const View& v, int b, int row, int head) {
  return b * v.batch_stride + row * v.row_stride + head * v.head_stride;
}

// Sizes, mask and score options of a problem, as the kernels read them.
struct Dims {
  int batch, seqlen_q, seqlen_k, nheads_q, nheads_kv, head_dim, head_dim_v;
  float scale, softcap;
  long long window_left, window_right;
  long long chunk;  // 0: none
  bool round_like_inputs;

  // Query i sees keys [first_key(i), last_key(i)] and key j is seen by queries
  // [first_query(j), last_query(j)] (empty when first > last); the diagonal is aligned
  // to the bottom-right corner, as in Problem::first_key / last_key. With a chunk, query
  // i and key j see each other only when j and i's position i + diag() share a chunk.
  __device__ long long diag() const { return static_cast<long long>(seqlen_k) - seqlen_q; }
  // The first position of the chunk holding `pos`, rounding down also before key 0.
  __device__ long long chunk_start(long long pos) const {
    return (pos >= 0 ? pos / chunk : -((-pos + chunk - 1) / chunk)) * chunk;
  }
  __device__ int first_key(int i) const {
    long long first = window_left < 0 ? 0 : max(0LL, i + diag() - window_left);
    if (chunk > 0) first = max(first, chunk_start(i + diag()));
    return static_cast<int>(first);
  }
  __device__ int last_key(int i) const {
    long long last = window_right < 0 ? seqlen_k - 1LL : min(seqlen_k - 1LL, i + diag() + window_right);
    if (chunk > 0) last = min(last, chunk_start(i + diag()) + chunk - 1);
    return static_cast<int>(last);
  }
  __device__ int first_query(int j) const {
    long long first = window_right < 0 ? 0 : max(0LL, j - diag() - window_right);
    if (chunk > 0) first = max(first, chunk_start(j) - diag());
    return static_cast<int>(first);
  }
  __device__ int last_query(int j) const {
    long long last = window_left < 0 ? seqlen_q - 1LL : min(seqlen_q - 1LL, j - diag() + window_left);
    if (chunk > 0) last = min(last, chunk_start(j) + chunk - 1 - diag());
    return static_cast<int>(last);
  }
  __device__ int group() const { return nheads_q / nheads_kv; }

  // Offsets of the dense fp32 arrays: q-like (batch, seqlen_q, nheads_q, head_dim) and
  // out-like (batch, seqlen_q, nheads_q, head_dim_v), k-like (batch, seqlen_k, nheads_kv,
  // head_dim) and v-like (batch, seqlen_k, nheads_kv, head_dim_v), statistics (batch,
  // nheads_q, seqlen_q).
  __device__ long long q_dense(int b, int i, int h) const { return q_row(b, i, h) * head_dim; }
  __device__ long long o_dense(int b, int i, int h) const { return q_row(b, i, h) * head_dim_v; }
  __device__ long long k_dense(int b, int j, int hk) const { return k_row(b, j, hk) * head_dim; }
  __device__ long long v_dense(int b, int j, int hk) const { return k_row(b, j, hk) * head_dim_v; }
  __device__ long long q_row(int b, int i, int h) const {
    return (static_cast<long long>(b) * seqlen_q + i) * nheads_q + h;
  }
  __device__ long long k_row(int b, int j, int hk) const {
    return (static_cast<long long>(b) * seqlen_k + j) * nheads_kv + hk;
  }
  __device__ long long stat(int b, int h, int i) const {
    return (static_cast<long long>(b) * nheads_q + h) * seqlen_q + i;
  }
};

Dims make_dims(const Problem& p, Precision precision) {
  return {static_cast<int>(p.batch),
          static_cast<int>(p.seqlen_q),
          static_cast<int>(p.seqlen_k),
          static_cast<int>(p.nheads_q),
          static_cast<int>(p.nheads_kv),
          static_cast<int>(p.head_dim),
          static_cast<int>(p.head_dim_v),
          p.softmax_scale,
          p.softcap,
          p.window_left,
          p.window_right,
          p.chunk,
          precision == Precision::kLikeInputs};
}

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

// A head-dim row held across the warp: lane l holds elements l, l + 32, ...; zeros past
// the head dim, so that dot products need no bounds. Rows of q and k (and dq, dk) hold
// kMaxDimPerLane elements per lane; rows of v and out (and dout, dv) VL, a template
// parameter of the kernels: kMaxDimPerLane up to head dim 256, so that only V head dims
// past it pay for registers and loop trips beyond q's, else kMaxVDimPerLane.
template <int N>
using Lanes = float[N];
using Row = Lanes<kMaxDimPerLane>;

template <class T, int N>
__device__ void load_row(Lanes<N>& x, const void* base, long long first, int head_dim) {
  const int lane = threadIdx.x % 32;
  for (int e = 0; e < N; ++e) {
    const int d = lane + 32 * e;
    x[e] = d < head_dim ? load<T>(base, first + d) : 0.f;
  }
}

template <int N>
__device__ void store_row(float* base, long long first, int head_dim, const Lanes<N>& x) {
  const int lane = threadIdx.x % 32;
  for (int e = 0; e < N; ++e) {
    const int d = lane + 32 * e;
    if (d < head_dim) base[first + d] = x[e];
  }
}

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int N>
__device__ float warp_dot(const Lanes<N>& a, const Lanes<N>& b) {
  float s = 0.f;
  for (int e = 0; e < N; ++e) s += a[e] * b[e];
  return warp_sum(s);
}

// The softmax input for a raw q.k dot product as the kernels define it (stored like a
// score matrix, scaled, optionally capped), and its derivative with respect to the dot
// product: the scale, times tanh' under softcap.
template <class T>
__device__ float logit(const Dims& d, float dot, float* slope) {
  float s = (d.round_like_inputs ? round_like<T>(dot) : dot) * d.scale;
  *slope = d.scale;
  if (d.softcap > 0.f) {
    const float t = tanhf(s / d.softcap);
    s = d.softcap * t;
    *slope = d.scale * (1.f - t * t);
  }
  return s;
}

// The (batch, head, row) of `batch` x `heads` x `seqlen` rows that this warp owns, one
// warp per row in that order; false for warps past the end.
__device__ bool warp_row(int batch, int heads, int seqlen, int* b, int* h, int* row) {
  const long long id = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (id >= static_cast<long long>(batch) * heads * seqlen) return false;
  *row = static_cast<int>(id % seqlen);
  *h = static_cast<int>(id / seqlen % heads);
  *b = static_cast<int>(id / (static_cast<long long>(seqlen) * heads));
  return true;
}

template <class T>
__device__ float maybe_round(const Dims& d, float x) {
  return d.round_like_inputs ? round_like<T>(x) : x;
}

struct FwdArgs {
  View q, k, v;
  const float* sinks;  // null: no sinks
  float* out;
  float* lse;
  Dims d;
};

// One warp per (batch, head, query row); two passes over the keys (statistics, then
// output), which is what a naive implementation computes, so the "like inputs" mode
// can round the normalized probabilities exactly where such an implementation would.
// The head's sink starts the max and the sum, as a score whose key has no value.
template <class T, int VL>
__global__ void reference_forward_kernel(FwdArgs a) {
  const Dims& d = a.d;
  int b, h, i;
  if (!warp_row(d.batch, d.nheads_q, d.seqlen_q, &b, &h, &i)) return;
  const int hk = h / d.group();
  const int first = d.first_key(i), last = d.last_key(i);

  Row q, k;
  Lanes<VL> v;
  load_row<T>(q, a.q.data, offset(a.q, b, i, h), d.head_dim);
  auto score = [&](int j) {
    load_row<T>(k, a.k.data, offset(a.k, b, j, hk), d.head_dim);
    float slope;
    return logit<T>(d, warp_dot(q, k), &slope);
  };

  const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  float m = sink;
  for (int j = first; j <= last; ++j) m = fmaxf(m, score(j));
  // A sink of -inf weighs 0, also where m is -inf (no key, where expf would give NaN).
  float sum = sink == -INFINITY ? 0.f : expf(sink - m);
  for (int j = first; j <= last; ++j) sum += expf(score(j) - m);

  Lanes<VL> o = {};
  for (int j = first; j <= last; ++j) {
    const float p = maybe_round<T>(d, expf(score(j) - m) / sum);
    if (p == 0.f) continue;
    load_row<T>(v, a.v.data, offset(a.v, b, j, hk), d.head_dim_v);
    for (int e = 0; e < VL; ++e) o[e] += p * v[e];
  }
  for (float& x : o) x = maybe_round<T>(d, x);
  store_row(a.out, d.o_dense(b, i, h), d.head_dim_v, o);
  if (a.lse != nullptr && threadIdx.x % 32 == 0) a.lse[d.stat(b, h, i)] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

struct BwdArgs {
  View q, k, v, dout;
  const float* sinks;  // null: no sinks
  const float* out;    // the reference forward's, dense (rounded like the inputs in kLikeInputs)
  const float* lse;    // dense statistics
  float* delta;        // D = rowsum(dout * out), dense statistics
  float *dq, *dk, *dv;
  float* dsinks;  // null: not asked for
  Dims d;
};

// The terms one (query row, key) pair adds to the gradients, from the rows held in
// registers: P, and dS = P (dP - D) * slope, rounded where a naive low-precision
// implementation stores them.
struct PairTerms {
  float p, ds;
};

template <class T, int VL>
__device__ PairTerms pair_terms(const Dims& d, const Row& q, const Row& k, const Lanes<VL>& v, const Lanes<VL>& dout,
                                float lse, float delta) {
  float slope;
  const float s = logit<T>(d, warp_dot(q, k), &slope);
  const float p = maybe_round<T>(d, expf(s - lse));
  const float dp = maybe_round<T>(d, warp_dot(dout, v));
  return {p, maybe_round<T>(d, p * (dp - delta) * slope)};
}

// D for each query row: one warp per row. Rows that see no key have out = 0, so D = 0.
template <class T, int VL>
__global__ void reference_delta_kernel(BwdArgs a) {
  const Dims& d = a.d;
  int b, h, i;
  if (!warp_row(d.batch, d.nheads_q, d.seqlen_q, &b, &h, &i)) return;
  Lanes<VL> dout, out;
  load_row<T>(dout, a.dout.data, offset(a.dout, b, i, h), d.head_dim_v);
  load_row<float>(out, a.out, d.o_dense(b, i, h), d.head_dim_v);
  const float delta = warp_dot(dout, out);
  if (threadIdx.x % 32 == 0) a.delta[d.stat(b, h, i)] = delta;
}

// dq of one query row per warp: the sum over the keys it sees of dS * k, in key order.
template <class T, int VL>
__global__ void reference_dq_kernel(BwdArgs a) {
  const Dims& d = a.d;
  int b, h, i;
  if (!warp_row(d.batch, d.nheads_q, d.seqlen_q, &b, &h, &i)) return;
  const int hk = h / d.group();
  const float lse = a.lse[d.stat(b, h, i)], delta = a.delta[d.stat(b, h, i)];

  Row q, k, dq = {};
  Lanes<VL> dout, v;
  load_row<T>(q, a.q.data, offset(a.q, b, i, h), d.head_dim);
  load_row<T>(dout, a.dout.data, offset(a.dout, b, i, h), d.head_dim_v);
  for (int j = d.first_key(i), last = d.last_key(i); j <= last; ++j) {
    load_row<T>(k, a.k.data, offset(a.k, b, j, hk), d.head_dim);
    load_row<T>(v, a.v.data, offset(a.v, b, j, hk), d.head_dim_v);
    const PairTerms t = pair_terms<T>(d, q, k, v, dout, lse, delta);
    for (int e = 0; e < kMaxDimPerLane; ++e) dq[e] += t.ds * k[e];
  }
  for (float& x : dq) x = maybe_round<T>(d, x);
  store_row(a.dq, d.q_dense(b, i, h), d.head_dim, dq);
}

// dk and dv of one key row of one KV head per warp: sums over the query heads of its
// group and the query rows that see the key, in (head, row) order as reference::backward
// adds them.
template <class T, int VL>
__global__ void reference_dkdv_kernel(BwdArgs a) {
  const Dims& d = a.d;
  int b, hk, j;
  if (!warp_row(d.batch, d.nheads_kv, d.seqlen_k, &b, &hk, &j)) return;

  Row k, q, dk = {};
  Lanes<VL> v, dout, dv = {};
  load_row<T>(k, a.k.data, offset(a.k, b, j, hk), d.head_dim);
  load_row<T>(v, a.v.data, offset(a.v, b, j, hk), d.head_dim_v);
  for (int h = hk * d.group(); h < (hk + 1) * d.group(); ++h) {
    for (int i = d.first_query(j), last = d.last_query(j); i <= last; ++i) {
      load_row<T>(q, a.q.data, offset(a.q, b, i, h), d.head_dim);
      load_row<T>(dout, a.dout.data, offset(a.dout, b, i, h), d.head_dim_v);
      const PairTerms t = pair_terms<T>(d, q, k, v, dout, a.lse[d.stat(b, h, i)], a.delta[d.stat(b, h, i)]);
      for (int e = 0; e < kMaxDimPerLane; ++e) dk[e] += t.ds * q[e];
      for (int e = 0; e < VL; ++e) dv[e] += t.p * dout[e];
    }
  }
  for (float& x : dk) x = maybe_round<T>(d, x);
  for (float& x : dv) x = maybe_round<T>(d, x);
  store_row(a.dk, d.k_dense(b, j, hk), d.head_dim, dk);
  store_row(a.dv, d.v_dense(b, j, hk), d.head_dim_v, dv);
}

// dsinks of one query head per warp: -exp(sink - lse) * D summed over the rows of every
// batch (reference::backward derives it), each lane over every 32nd row, then across the
// warp. A row with neither a key nor a sink (lse -inf) has D = 0 and adds nothing.
__global__ void reference_dsinks_kernel(BwdArgs a) {
  const Dims& d = a.d;
  const int h = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (h >= d.nheads_q) return;
  const float sink = a.sinks[h];
  const long long rows = static_cast<long long>(d.batch) * d.seqlen_q;
  float sum = 0.f;
  for (long long r = threadIdx.x % 32; r < rows; r += 32) {
    const long long at = d.stat(static_cast<int>(r / d.seqlen_q), h, static_cast<int>(r % d.seqlen_q));
    if (a.lse[at] != -INFINITY) sum -= expf(sink - a.lse[at]) * a.delta[at];
  }
  sum = warp_sum(sum);
  if (threadIdx.x % 32 == 0) a.dsinks[h] = sum;
}

unsigned blocks_for(long long warps) { return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }
constexpr unsigned kThreads = 32 * kWarpsPerBlock;

// Calls f with a value of the element type of `dtype` (one that check_supported accepts)
// and the elements per lane of `head_dim_v`'s rows (a std::integral_constant: VL).
template <class F>
void with_element_type(DType dtype, std::int64_t head_dim_v, F&& f) {
  auto with_lanes = [&](auto element) {
    if (head_dim_v <= 32 * kMaxDimPerLane) {
      f(element, std::integral_constant<int, kMaxDimPerLane>{});
    } else {
      f(element, std::integral_constant<int, kMaxVDimPerLane>{});
    }
  };
  switch (dtype) {
    case DType::kBFloat16: with_lanes(__nv_bfloat16{}); break;
    case DType::kFloat16: with_lanes(__half{}); break;
    default: with_lanes(float{}); break;
  }
}

Status check_supported(const Problem& p, DType dtype) {
  if (p.head_dim > 32 * kMaxDimPerLane) {
    return {StatusCode::kNotSupported, "CUDA reference: head dim over " + std::to_string(32 * kMaxDimPerLane)};
  }
  if (p.head_dim_v > 32 * kMaxVDimPerLane) {
    return {StatusCode::kNotSupported, "CUDA reference: V head dim over " + std::to_string(32 * kMaxVDimPerLane)};
  }
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16 && dtype != DType::kFloat32) {
    return {StatusCode::kNotSupported, "CUDA reference: unsupported dtype"};
  }
  return Status::ok();
}

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return {StatusCode::kCudaError, std::string("CUDA reference ") + what + ": " + cudaGetErrorString(err)};
}

// D, then dq, then dk and dv, then dsinks, in `stream`'s order (out and lse are already
// there).
Status launch_gradients(const BwdArgs& a, DType dtype, cudaStream_t stream) {
  const unsigned q_blocks = blocks_for(static_cast<long long>(a.d.batch) * a.d.nheads_q * a.d.seqlen_q);
  const unsigned k_blocks = blocks_for(static_cast<long long>(a.d.batch) * a.d.nheads_kv * a.d.seqlen_k);
  with_element_type(dtype, a.d.head_dim_v, [&](auto element, auto lanes) {
    using T = decltype(element);
    constexpr int VL = decltype(lanes)::value;
    reference_delta_kernel<T, VL><<<q_blocks, kThreads, 0, stream>>>(a);
    reference_dq_kernel<T, VL><<<q_blocks, kThreads, 0, stream>>>(a);
    reference_dkdv_kernel<T, VL><<<k_blocks, kThreads, 0, stream>>>(a);
  });
  if (a.sinks != nullptr && a.dsinks != nullptr) {
    reference_dsinks_kernel<<<blocks_for(a.d.nheads_q), kThreads, 0, stream>>>(a);
  }
  return cuda_status(cudaGetLastError(), "launch");
}

}  // namespace

Status cuda_forward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v, const float* sinks,
                    float* out, float* lse, Precision precision, cudaStream_t stream) {
  const Status supported = check_supported(p, q.dtype);
  if (!supported.is_ok()) return supported;
  const FwdArgs a{make_view(q), make_view(k), make_view(v), sinks, out, lse, make_dims(p, precision)};
  const unsigned blocks = blocks_for(p.batch * p.nheads_q * p.seqlen_q);
  with_element_type(q.dtype, p.head_dim_v, [&](auto element, auto lanes) {
    reference_forward_kernel<decltype(element), decltype(lanes)::value><<<blocks, kThreads, 0, stream>>>(a);
  });
  return cuda_status(cudaGetLastError(), "launch");
}

Status cuda_backward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                     const float* sinks, const TensorView& dout, float* dq, float* dk, float* dv, float* dsinks,
                     Precision precision, cudaStream_t stream) {
  const Status supported = check_supported(p, q.dtype);
  if (!supported.is_ok()) return supported;
  const long long rows = p.batch * p.nheads_q * p.seqlen_q;
  const long long out_elems = rows * p.head_dim_v;
  float* scratch = nullptr;
  const std::size_t scratch_bytes = static_cast<std::size_t>(out_elems + 2 * rows) * sizeof(float);
  const Status allocated =
      cuda_status(cudaMallocAsync(reinterpret_cast<void**>(&scratch), scratch_bytes, stream), "scratch allocation");
  if (!allocated.is_ok()) return allocated;
  const BwdArgs a{make_view(q), make_view(k), make_view(v), make_view(dout), sinks, scratch, scratch + out_elems,
                  scratch + out_elems + rows, dq, dk, dv, dsinks, make_dims(p, precision)};
  const Status forward = cuda_forward(p, q, k, v, sinks, scratch, scratch + out_elems, precision, stream);
  const Status gradients = forward.is_ok() ? launch_gradients(a, q.dtype, stream) : forward;
  const Status freed = cuda_status(cudaFreeAsync(scratch, stream), "scratch release");
  return gradients.is_ok() ? freed : gradients;
}

}  // namespace fa3::reference
