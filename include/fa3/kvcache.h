// fa3 — attention over a KV cache (FlashAttention-3's flash_attn_with_kvcache) and the
// exact merge of split partial results (its flash_attn_combine).
//
// A KV-cache call is its own argument struct rather than more fields on ForwardArgs: its
// keys are not a tensor but a cache (rows of a contiguous cache, or pages) plus lengths,
// it writes into that cache, and it has no backward pass, so none of the rules of
// ForwardArgs' k and v (nor BackwardArgs) apply to it. Its masks and options are
// AttentionOptions, with the meaning they have in fa3/attention.h.
//
// The cache. k_cache is either contiguous, (batch_cache, seqlen_cache, nheads_kv,
// head_dim), one row per sequence, or paged, (num_pages, page_size, nheads_kv, head_dim)
// with page_table (batch, max_pages_per_seq) int32: position p of sequence b lies in page
// page_table[b][p / page_size] at row p % page_size. Any page_size >= 1. v_cache has
// k_cache's shape with head_dim_v last. Sequence b uses cache row cache_batch_idx[b]
// (contiguous cache only; b itself when not given), whose valid entries are the positions
// [cache_leftpad[b], cache_seqlens[b]) (cache_leftpad 0 when not given).
//
// Appending. With k_new / v_new (batch, seqlen_new, nheads_kv, head_dim / head_dim_v),
// the call first writes them into the cache at positions cache_seqlens[b] .. +
// seqlen_new - 1, in place (the caller's cache is changed, as in FlashAttention-3), then
// attends over positions [cache_leftpad[b], cache_seqlens[b] + seqlen_new): the
// sequence's seqlen_k. Masks align to the bottom-right corner of (seqlen_q, seqlen_k)
// per sequence, as a fixed-length call of batch 1 would, and a sequence whose seqlen_k
// is 0 gives out 0 and lse -inf.
//
// Rotary embedding (only with k_new, as in FlashAttention-3). rotary_cos and rotary_sin
// are (seqlen_ro, rotary_dim / 2) in q's dtype; the first rotary_dim columns of q and of
// k_new are rotated, as pairs (x[2i], x[2i + 1]) when rotary_interleaved (GPT-J) or as
// halves (x[i], x[i + rotary_dim / 2]) otherwise (GPT-NeoX), by angle row r of the
// tables. Row r of k_new sits at r = pos[b] + i, with pos[b] = rotary_seqlens[b] when
// given, else cache_seqlens[b]: its absolute cache position. Query row i takes pos[b] + i
// when the call is causal or has a window (the query rows are the new tokens), else
// pos[b] for every row. The rotated values are rounded to q's dtype, and the cache
// receives the rotated k_new.
//
// FP8 (e4m3). q, k_cache, v_cache (and k_new, v_new) may be e4m3 codes, as in
// FlashAttention-3's FP8 KV cache: their real values are the codes times fp8's
// q_descale / k_descale / v_descale, fp32 (batch, nheads_kv), each 1 when not given; new
// rows are appended as the codes they are (quantized with the cache's scales); out is
// bf16 or fp16 and lse fp32. Block scales and a rotary embedding are refused with e4m3
// inputs (kInvalidArgument, naming them). fa3::cpu computes such a call with the FP8
// forward's numerics (fa3/attention.h). forward_with_kvcache runs it on e4m3 KV-cache
// kernels (the codes converted to fp16, exactly, for fp16 GEMMs; P in fp16) in a build
// with FA3_GPU_FP8_KVCACHE (BuildInfo::gpu_fp8_kvcache, on by default) and refuses it
// otherwise (kNotSupported, naming q); head dims there are multiples of 16.
//
// Split KV. num_splits only steers how the GPU divides the keys; the result never
// depends on it, and fa3::cpu ignores it. scheduler_metadata (get_scheduler_metadata's)
// is likewise accepted and ignored by fa3::cpu.
//
// Combine. out_partial (num_splits, rows, nheads, head_dim) fp32 and lse_partial
// (num_splits, rows, nheads) fp32 — FlashAttention-3's (num_splits, batch, seqlen, ...)
// with batch and seqlen flattened to rows — merge into
//   lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) * out_s,
// out (rows, nheads, head_dim) in fp32, fp16 or bf16 and the optional lse (rows, nheads)
// fp32. A row whose partial lse are all -inf gets out 0 and lse -inf. Any number of
// splits; lse_partial and lse take any strides, the others a contiguous last dimension.
//
// fa3::cpu runs both. On the GPU, combine runs on the kernel of merge_attention_states
// (fa3/merge.h), on a Hopper GPU with every tensor in the current device's memory.
// forward_with_kvcache runs on kernels of its own (split-KV over the cache, the query
// heads of one KV head together, then that merge) in a build with FA3_GPU_KVCACHE, and
// is refused (kNotSupported) otherwise. There the splits are at most 128 and at most the
// cache's blocks of 64 positions, and q, k_cache, v_cache and (with one split) out must
// have 16-byte aligned addresses and row strides (refused with kNotSupported otherwise).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "fa3/attention.h"
#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3 {

struct KvCacheArgs {
  TensorView q;                // (batch, seqlen_q, nheads_q, head_dim)
  TensorView k_cache;          // contiguous or paged (see above); written when k_new is given
  TensorView v_cache;          // k_cache's layout with head_dim_v; written when v_new is given
  TensorView cache_seqlens;    // int32 (batch): valid entries of each sequence's cache
  TensorView page_table;       // optional int32 (batch, max_pages_per_seq): a paged cache
  TensorView cache_batch_idx;  // optional int32 (batch): the cache row of each sequence
  TensorView cache_leftpad;    // optional int32 (batch): the first valid cache entry
  TensorView k_new;            // optional (batch, seqlen_new, nheads_kv, head_dim): appended
  TensorView v_new;            // optional (batch, seqlen_new, nheads_kv, head_dim_v): appended
  TensorView rotary_cos;       // optional (seqlen_ro, rotary_dim / 2), q's dtype
  TensorView rotary_sin;       // optional, rotary_cos's shape and dtype
  TensorView rotary_seqlens;   // optional int32 (batch): rotary positions instead of cache_seqlens
  bool rotary_interleaved = true;
  TensorView out;    // written; (batch, seqlen_q, nheads_q, head_dim_v), q's dtype (bf16 / fp16 for e4m3)
  TensorView lse;    // optional; written: fp32 (batch, nheads_q, seqlen_q)
  TensorView sinks;  // optional fp32 (nheads_q), as in ForwardArgs
  Fp8Args fp8;       // optional, with e4m3 inputs: descales only (see above)
  AttentionOptions options;
  int num_splits = 0;  // 0: the GPU's heuristic; >= 0; never changes the result
  // Device scratch memory of the GPU path, owned by the caller: at least
  // kvcache_workspace_size() bytes (0 for a call of one split without a rotary
  // embedding, which may pass none), 256-byte aligned. It holds q's rotated copy and the
  // splits' fp32 results. Its contents on entry do not matter, and it is the caller's
  // again once the call's work on the stream is done; no memory is allocated inside a
  // call. Ignored by fa3::cpu.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

struct CombineArgs {
  TensorView out_partial;  // fp32 (num_splits, rows, nheads, head_dim)
  TensorView lse_partial;  // fp32 (num_splits, rows, nheads)
  TensorView out;          // written; (rows, nheads, head_dim): fp32, fp16 or bf16
  TensorView lse;          // optional; written: fp32 (rows, nheads)
};

// On the current CUDA device (a Hopper GPU), enqueued on `stream`, in a build with the
// GPU KV-cache path (BuildInfo::gpu_kvcache, the FA3_GPU_KVCACHE option); otherwise
// refused (kNotSupported) after every other rule. Every pointer must be device memory of
// the current device; the index tensors' values are read by the kernels, unchecked. On
// any rejection nothing is written and nothing is enqueued.
Status forward_with_kvcache(const KvCacheArgs& args, cudaStream_t stream);
// The workspace forward_with_kvcache needs for `args`, in bytes, on the current device.
// Validates `args` as forward_with_kvcache() does, except the workspace and where the
// pointers live, so it can be asked before the workspace exists; reads no tensor data
// and enqueues nothing.
Status kvcache_workspace_size(const KvCacheArgs& args, std::size_t* bytes);
// On the current CUDA device, enqueued on `stream`; nothing is written when the call is
// rejected.
Status combine(const CombineArgs& args, cudaStream_t stream);

}  // namespace fa3
