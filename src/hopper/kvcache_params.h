// fa3 — what the KV-cache kernels (hopper/kvcache_kernel.cuh, kvcache_append.cu) read:
// addresses, strides in elements, lengths and the resolved options of one
// forward_with_kvcache call. Plain C++: the host fills it, the kernels take it by value.
#pragma once

#include <cstdint>

namespace fa3::hopper {

// A cache (k_cache or v_cache): row `pos` of head h of sequence b lies at
//   page_table[b][pos / page_size] * stride[0] + (pos % page_size) * stride[1] + h * stride[2]
// when paged, else at cache_row(b) * stride[0] + pos * stride[1] + h * stride[2].
struct CacheTensor {
  void* data = nullptr;
  std::int64_t stride[3] = {0, 0, 0};
};

// Where each sequence's keys are: the index tensors, all int32 in device memory.
struct CacheIndex {
  const std::int32_t* seqlens = nullptr;    // cache_seqlens (batch)
  const std::int32_t* batch_idx = nullptr;  // cache_batch_idx, or null: sequence b uses row b
  const std::int32_t* leftpad = nullptr;    // cache_leftpad, or null: 0
  const std::int32_t* page_table = nullptr; // null: a contiguous cache
  std::int64_t page_table_stride = 0;       // elements from one sequence's pages to the next
  int page_size = 0;
  int seqlen_new = 0;  // rows appended before the attention (k_new / v_new)
};

// A (batch, seqlen, nheads, dim) tensor with a contiguous last dimension.
struct RowsTensor {
  void* data = nullptr;
  std::int64_t stride[3] = {0, 0, 0};
};

struct KvCacheParams {
  RowsTensor q;    // q, or its rotated copy in the workspace
  CacheTensor k;
  CacheTensor v;
  CacheIndex index;
  RowsTensor out;  // with one split
  float* lse = nullptr;  // (batch, nheads_q, seqlen_q), or null
  std::int64_t lse_stride[3] = {0, 0, 0};  // batch, head, row
  // With more than one split, each split's fp32 result in the workspace,
  // (num_splits, batch, seqlen_q, nheads_q, head_dim_v) and (num_splits, batch,
  // seqlen_q, nheads_q), contiguous; the merge kernel combines them into out and lse.
  float* out_partial = nullptr;
  float* lse_partial = nullptr;
  const float* sinks = nullptr;  // (nheads_q), or null
  std::int64_t sinks_stride = 0;
  // An e4m3 call's descales (batch, nheads_kv), each null when not given (a factor of 1).
  struct Descale {
    const float* ptr = nullptr;
    std::int64_t stride[2] = {0, 0};
  };
  Descale q_descale, k_descale, v_descale;

  int batch = 0;
  int seqlen_q = 0;
  int nheads_q = 0;
  int nheads_kv = 0;
  int group = 0;       // nheads_q / nheads_kv: the query heads of one KV head
  int head_dim = 0;    // of q and k
  int head_dim_v = 0;  // of v and out
  int num_splits = 1;

  float softmax_scale = 0.f;
  float softcap = 0.f;   // 0: off
  int window_left = -1;  // -1: unbounded; causal resolves to window_right 0
  int window_right = -1;
  int chunk = 0;  // attention_chunk; 0: none
  // The splits of a tile are one cluster and merge their rows in distributed shared
  // memory, writing out and lse themselves (KvCachePlan::cluster_merge).
  bool cluster_merge = false;
};

// The append and the rotary embedding: k_new and v_new into the cache, q's rotated copy.
struct KvAppendParams {
  RowsTensor k_new;
  RowsTensor v_new;
  CacheTensor k;
  CacheTensor v;
  CacheIndex index;
  RowsTensor q;          // read
  RowsTensor q_rotated;  // written: contiguous (batch, seqlen_q, nheads_q, head_dim)
  const void* rotary_cos = nullptr;  // (seqlen_ro, rotary_dim / 2)
  const void* rotary_sin = nullptr;
  std::int64_t cos_stride = 0;  // elements from one table row to the next
  std::int64_t sin_stride = 0;
  const std::int32_t* rotary_seqlens = nullptr;  // or null: cache_seqlens
  int rotary_dim = 0;  // 0: none
  bool interleaved = true;
  bool q_per_row = false;  // query row i at position pos + i (causal or windowed), else pos

  int batch = 0;
  int seqlen_q = 0;
  int nheads_q = 0;
  int nheads_kv = 0;
  int head_dim = 0;
  int head_dim_v = 0;
};

}  // namespace fa3::hopper
