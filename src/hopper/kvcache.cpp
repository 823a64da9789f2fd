#include "hopper/kvcache.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "hopper/kvcache_append.h"
#include "hopper/kvcache_config.h"
#include "hopper/kvcache_splits.h"
#include "hopper/merge.h"

namespace fa3::hopper {

// The compiled families (src/CMakeLists.txt writes the list).
#define FA3_KVCACHE_INSTANCE(dtype, hdim, hdim_v) \
  Status kvcache_##dtype##_hdim##hdim##v##hdim_v(const KvCacheParams&, int, cudaStream_t);
#include "kvcache_registry.inc"
#undef FA3_KVCACHE_INSTANCE

namespace {

// A family's input and output dtypes by its name's dtype part.
constexpr DType kIn_bf16 = DType::kBFloat16, kOut_bf16 = DType::kBFloat16;
constexpr DType kIn_fp16 = DType::kFloat16, kOut_fp16 = DType::kFloat16;
[[maybe_unused]] constexpr DType kIn_e4m3bf16 = DType::kFloat8E4M3, kOut_e4m3bf16 = DType::kBFloat16;
[[maybe_unused]] constexpr DType kIn_e4m3fp16 = DType::kFloat8E4M3, kOut_e4m3fp16 = DType::kFloat16;

struct KvCacheKernel {
  DType dtype;      // q's and the caches'
  DType out_dtype;  // out's
  int head_dim;
  int head_dim_v;
  Status (*launch)(const KvCacheParams&, int, cudaStream_t);
};

const std::vector<KvCacheKernel>& kernels() {
  static const std::vector<KvCacheKernel> list = {
#define FA3_KVCACHE_INSTANCE(dtype, hdim, hdim_v) \
  {kIn_##dtype, kOut_##dtype, hdim, hdim_v, &kvcache_##dtype##_hdim##hdim##v##hdim_v},
#include "kvcache_registry.inc"
#undef FA3_KVCACHE_INSTANCE
  };
  return list;
}

constexpr std::size_t kAlign = 256;
std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The kernels move 16 bytes at a time along rows of q, the caches and out: the address
// and every row stride (of a dimension longer than 1) must keep that alignment.
Status check_aligned(const char* name, const TensorView& t) {
  const std::int64_t unit = 16 / static_cast<std::int64_t>(dtype_size(t.dtype));
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) {
    return {StatusCode::kNotSupported,
            std::string(name) + ": the address is not 16-byte aligned, as the GPU's KV-cache kernel needs"};
  }
  for (int d = 0; d + 1 < t.rank; ++d) {
    if (t.shape[d] > 1 && t.stride[d] % unit != 0) {
      return {StatusCode::kNotSupported, std::string(name) + ": stride " + std::to_string(t.stride[d]) + " of dim " +
                                             std::to_string(d) + " is not a multiple of 16 bytes, as the GPU's " +
                                             "KV-cache kernel needs"};
    }
  }
  return Status::ok();
}

RowsTensor rows_of(const TensorView& t) {
  RowsTensor r;
  r.data = t.data;
  for (int d = 0; d < 3; ++d) r.stride[d] = t.stride[d];
  return r;
}

CacheTensor cache_of(const TensorView& t) {
  CacheTensor c;
  c.data = t.data;
  for (int d = 0; d < 3; ++d) c.stride[d] = t.stride[d];
  return c;
}

const std::int32_t* index_of(const TensorView& t) {
  return t.defined() ? static_cast<const std::int32_t*>(t.data) : nullptr;
}

CacheIndex cache_index(const KvCacheProblem& kp, const KvCacheArgs& a) {
  CacheIndex ix;
  ix.seqlens = index_of(a.cache_seqlens);
  ix.batch_idx = index_of(a.cache_batch_idx);
  ix.leftpad = index_of(a.cache_leftpad);
  ix.page_table = index_of(a.page_table);
  ix.page_table_stride = a.page_table.defined() ? a.page_table.stride[0] : 0;
  ix.page_size = static_cast<int>(kp.page_size);
  ix.seqlen_new = static_cast<int>(kp.seqlen_new);
  return ix;
}

std::int64_t contiguous_rows(const Problem& p) { return p.batch * p.seqlen_q * p.nheads_q; }

// A window side or chunk for the kernel's 32-bit position arithmetic: one past every
// position a cache holds means the same as any larger one, and keeps i + seqlen_k -
// seqlen_q - left from overflowing.
int position_bound(std::int64_t v) { return v < 0 ? -1 : static_cast<int>(std::min<std::int64_t>(v, 1 << 30)); }

}  // namespace

bool kvcache_enabled() {
#ifdef FA3_GPU_KVCACHE
  return true;
#else
  return false;
#endif
}

bool kvcache_fp8_enabled() {
#ifdef FA3_GPU_FP8_KVCACHE
  return kvcache_enabled();
#else
  return false;
#endif
}

bool kvcache_cluster_merge_enabled() { return kvcache_enabled() && kKvClusterMerge; }

namespace {

// A field's distinct values over the 16-bit families, sorted.
template <class T>
std::vector<T> sixteen_bit_family_values(T KvCacheKernel::*field) {
  std::vector<T> out;
  for (const KvCacheKernel& k : kernels()) {
    if (k.dtype != DType::kFloat8E4M3 && std::find(out.begin(), out.end(), k.*field) == out.end()) {
      out.push_back(k.*field);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<DType> kvcache_dtypes() { return sixteen_bit_family_values(&KvCacheKernel::dtype); }

std::vector<int> kvcache_head_dims() { return sixteen_bit_family_values(&KvCacheKernel::head_dim); }

Status plan_kvcache(const KvCacheProblem& kp, DType dtype, int num_splits, int num_sms, KvCachePlan* plan) {
  const Problem& p = kp.attention;
  KvCachePlan out;
  // Each cached row arrives by one bulk copy, whose size must be a multiple of 16 bytes.
  const bool fp8 = dtype == DType::kFloat8E4M3;
  const int unit = 16 / static_cast<int>(dtype_size(dtype));
  if (p.head_dim % unit != 0 || p.head_dim_v % unit != 0) {
    return {StatusCode::kNotSupported, "k_cache: head dims " + std::to_string(p.head_dim) + " (q, k) and " +
                                           std::to_string(p.head_dim_v) + " (v) must be multiples of " +
                                           std::to_string(unit) + " for the GPU's KV-cache kernel, which copies " +
                                           "whole rows in 16-byte units"};
  }
  // The narrowest compiled family at least as wide as both head dims: the extra columns
  // are read as zeros and never written. An e4m3 call's family is also that of its out.
  const DType out_dtype = fp8 ? kp.out_dtype : dtype;
  for (const KvCacheKernel& k : kernels()) {
    if (k.dtype != dtype || k.out_dtype != out_dtype || k.head_dim < p.head_dim || k.head_dim_v < p.head_dim_v) {
      continue;
    }
    if (out.launch == nullptr || k.head_dim + k.head_dim_v < out.head_dim + out.head_dim_v) {
      out.head_dim = k.head_dim;
      out.head_dim_v = k.head_dim_v;
      out.launch = k.launch;
    }
  }
  if (out.launch == nullptr) {
    const std::string kind = fp8 ? "e4m3 (out " + std::string(dtype_name(out_dtype)) + ")" : dtype_name(dtype);
    return {StatusCode::kNotSupported, "q: no GPU KV-cache kernel was built for " + kind + " with head dims " +
                                           std::to_string(p.head_dim) + " (q, k) and " + std::to_string(p.head_dim_v) +
                                           " (v)"};
  }
  if (kp.capacity > (std::int64_t{1} << 30)) {
    return {StatusCode::kNotSupported, "k_cache: " + std::to_string(kp.capacity) +
                                           " positions per sequence are more than the GPU's KV-cache kernel takes (2^30)"};
  }
  const std::int64_t rows = p.seqlen_q * p.group_size();
  out.block_m = rows <= 16 ? 16 : 64;
  // Without the caller's count: the count whose CTAs fill the SMs' slots in the fewest,
  // fullest waves (hopper/kvcache_splits.h), counting the merge kernel's launch where the
  // splits could merge in a cluster instead; never more than a sequence's cache has key
  // blocks (each split then has one at least) nor than the merge takes.
  const std::int64_t ctas = p.batch * p.nheads_kv * ((rows + out.block_m - 1) / out.block_m);
  const std::int64_t key_blocks = (kp.capacity + KvCacheTile<64, 64, 64>::kBlockN - 1) / KvCacheTile<64, 64, 64>::kBlockN;
  std::int64_t splits = num_splits;
  if (splits == 0) {
    const std::int64_t slots = static_cast<std::int64_t>(num_sms) *
                               kvcache_ctas_per_sm(kvcache_smem_bytes(out.head_dim, out.head_dim_v, out.block_m, fp8));
    splits = kKvClusterMerge ? kvcache_cluster_splits(ctas, key_blocks, slots)
                             : kvcache_default_splits(ctas, key_blocks, slots);
  }
  splits = std::clamp<std::int64_t>(splits, 1, std::max<std::int64_t>(1, std::min<std::int64_t>(key_blocks, kMaxKvSplits)));
  out.num_splits = static_cast<int>(splits);
  out.cluster_merge = kKvClusterMerge && splits > 1 && splits <= kMaxKvClusterSplits;

  std::size_t bytes = 0;
  if (kp.rotary_dim > 0) {
    out.q_rotated_offset = bytes;
    bytes += aligned(static_cast<std::size_t>(contiguous_rows(p) * p.head_dim) * dtype_size(dtype));
  }
  if (out.num_splits > 1 && !out.cluster_merge) {
    out.out_partial_offset = bytes;
    bytes += aligned(static_cast<std::size_t>(splits * contiguous_rows(p) * p.head_dim_v) * sizeof(float));
    out.lse_partial_offset = bytes;
    bytes += aligned(static_cast<std::size_t>(splits * contiguous_rows(p)) * sizeof(float));
  }
  out.bytes = bytes;
  *plan = out;
  return Status::ok();
}

Status run_kvcache(const KvCacheProblem& kp, const KvCacheArgs& a, const KvCachePlan& plan, cudaStream_t stream) {
  const Problem& p = kp.attention;
  if (kp.rotary_dim == 0) FA3_RETURN_IF_ERROR(check_aligned("q", a.q));  // else its aligned copy is read
  FA3_RETURN_IF_ERROR(check_aligned("k_cache", a.k_cache));
  FA3_RETURN_IF_ERROR(check_aligned("v_cache", a.v_cache));
  const bool writes_out = plan.num_splits == 1 || plan.cluster_merge;  // else the merge kernel does
  if (writes_out) FA3_RETURN_IF_ERROR(check_aligned("out", a.out));
  std::byte* workspace = static_cast<std::byte*>(a.workspace);

  KvCacheParams k;
  k.q = rows_of(a.q);
  k.k = cache_of(a.k_cache);
  k.v = cache_of(a.v_cache);
  k.index = cache_index(kp, a);
  k.out = rows_of(a.out);
  if (a.lse.defined()) {
    k.lse = static_cast<float*>(a.lse.data);
    for (int d = 0; d < 3; ++d) k.lse_stride[d] = a.lse.stride[d];
  }
  if (a.sinks.defined()) {
    k.sinks = static_cast<const float*>(a.sinks.data);
    k.sinks_stride = a.sinks.stride[0];
  }
  const auto descale = [](const TensorView& t) {
    KvCacheParams::Descale d;
    if (t.defined()) {
      d.ptr = static_cast<const float*>(t.data);
      d.stride[0] = t.stride[0];
      d.stride[1] = t.stride[1];
    }
    return d;
  };
  k.q_descale = descale(a.fp8.q_descale);
  k.k_descale = descale(a.fp8.k_descale);
  k.v_descale = descale(a.fp8.v_descale);
  k.batch = static_cast<int>(p.batch);
  k.seqlen_q = static_cast<int>(p.seqlen_q);
  k.nheads_q = static_cast<int>(p.nheads_q);
  k.nheads_kv = static_cast<int>(p.nheads_kv);
  k.group = static_cast<int>(p.group_size());
  k.head_dim = static_cast<int>(p.head_dim);
  k.head_dim_v = static_cast<int>(p.head_dim_v);
  k.num_splits = plan.num_splits;
  k.cluster_merge = plan.cluster_merge;
  k.softmax_scale = p.softmax_scale;
  k.softcap = p.softcap;
  k.window_left = position_bound(p.window_left);
  k.window_right = position_bound(p.window_right);
  k.chunk = p.chunk > 0 ? position_bound(p.chunk) : 0;

  if (kp.seqlen_new > 0 || kp.rotary_dim > 0) {
    KvAppendParams ap;
    if (kp.seqlen_new > 0) {
      ap.k_new = rows_of(a.k_new);
      ap.v_new = rows_of(a.v_new);
    }
    ap.k = k.k;
    ap.v = k.v;
    ap.index = k.index;
    ap.q = k.q;
    if (kp.rotary_dim > 0) {
      // The kernel reads the rotated copy, contiguous, instead of q.
      ap.q_rotated.data = workspace + plan.q_rotated_offset;
      ap.q_rotated.stride[2] = p.head_dim;
      ap.q_rotated.stride[1] = p.nheads_q * p.head_dim;
      ap.q_rotated.stride[0] = p.seqlen_q * p.nheads_q * p.head_dim;
      ap.rotary_cos = a.rotary_cos.data;
      ap.rotary_sin = a.rotary_sin.data;
      ap.cos_stride = a.rotary_cos.stride[0];
      ap.sin_stride = a.rotary_sin.stride[0];
      ap.rotary_seqlens = index_of(a.rotary_seqlens);
      ap.rotary_dim = static_cast<int>(kp.rotary_dim);
      ap.interleaved = a.rotary_interleaved;
      ap.q_per_row = p.causal || p.has_window();
      k.q = ap.q_rotated;
    }
    ap.batch = k.batch;
    ap.seqlen_q = k.seqlen_q;
    ap.nheads_q = k.nheads_q;
    ap.nheads_kv = k.nheads_kv;
    ap.head_dim = k.head_dim;
    ap.head_dim_v = k.head_dim_v;
    FA3_RETURN_IF_ERROR(launch_kvcache_append(ap, a.q.dtype, stream));
  }

  if (!writes_out) {
    k.out_partial = reinterpret_cast<float*>(workspace + plan.out_partial_offset);
    k.lse_partial = reinterpret_cast<float*>(workspace + plan.lse_partial_offset);
  }
  FA3_RETURN_IF_ERROR(plan.launch(k, plan.block_m, stream));
  if (writes_out) return Status::ok();
  return launch_split_merge(k.out_partial, k.lse_partial, plan.num_splits, a.out, a.lse, stream);
}

}  // namespace fa3::hopper
