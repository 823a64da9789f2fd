#include "kvcache_bindings.h"

#include <cuda_runtime_api.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "call_status.h"
#include "dlpack_views.h"
#include "fa3/cpu.h"
#include "fa3/kvcache.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace fa3::python {
namespace {

using OptIn = std::optional<InArray>;

// The optional tensors of a KV-cache call, in the order the binding takes them.
struct KvCacheExtras {
  OptIn k_new, v_new, page_table, cache_batch_idx, cache_leftpad, rotary_cos, rotary_sin, rotary_seqlens, sinks;
  OptIn q_descale, k_descale, v_descale;

  void apply(KvCacheArgs& a, Placement& where) const {
    const std::pair<const char*, std::pair<const OptIn*, TensorView*>> fields[] = {
        {"k_new", {&k_new, &a.k_new}},
        {"v_new", {&v_new, &a.v_new}},
        {"page_table", {&page_table, &a.page_table}},
        {"cache_batch_idx", {&cache_batch_idx, &a.cache_batch_idx}},
        {"cache_leftpad", {&cache_leftpad, &a.cache_leftpad}},
        {"rotary_cos", {&rotary_cos, &a.rotary_cos}},
        {"rotary_sin", {&rotary_sin, &a.rotary_sin}},
        {"rotary_seqlens", {&rotary_seqlens, &a.rotary_seqlens}},
        {"sinks", {&sinks, &a.sinks}},
        {"q_descale", {&q_descale, &a.fp8.q_descale}},
        {"k_descale", {&k_descale, &a.fp8.k_descale}},
        {"v_descale", {&v_descale, &a.fp8.v_descale}},
    };
    for (const auto& [name, field] : fields) {
      if (*field.first) *field.second = to_view(name, **field.first, where);
    }
  }
};

// The call's arguments; k_cache and v_cache are written (the append), so they are taken
// writable.
KvCacheArgs kvcache_args(const InArray& q, const OutArray& k_cache, const OutArray& v_cache,
                         const InArray& cache_seqlens, const OutArray& out, const std::optional<OutArray>& lse,
                         const OptIn& k_new, const OptIn& v_new, const OptIn& page_table, const OptIn& cache_batch_idx,
                         const OptIn& cache_leftpad, const OptIn& rotary_cos, const OptIn& rotary_sin,
                         const OptIn& rotary_seqlens, bool rotary_interleaved, const OptIn& sinks,
                         const OptIn& q_descale, const OptIn& k_descale, const OptIn& v_descale, float softmax_scale,
                         bool causal, int window_left, int window_right, float softcap, int attention_chunk,
                         int num_splits, int sm_margin, Placement& where) {
  KvCacheArgs args;
  args.q = to_view("q", q, where);
  args.k_cache = to_view("k_cache", k_cache, where);
  args.v_cache = to_view("v_cache", v_cache, where);
  args.cache_seqlens = to_view("cache_seqlens", cache_seqlens, where);
  args.out = to_view("out", out, where);
  if (lse) args.lse = to_view("lse", *lse, where);
  KvCacheExtras{k_new,      v_new,      page_table, cache_batch_idx, cache_leftpad, rotary_cos, rotary_sin,
                rotary_seqlens, sinks, q_descale, k_descale, v_descale}
      .apply(args, where);
  args.rotary_interleaved = rotary_interleaved;
  args.options.softmax_scale = softmax_scale;
  args.options.causal = causal;
  args.options.window_left = window_left;
  args.options.window_right = window_right;
  args.options.softcap = softcap;
  args.options.attention_chunk = attention_chunk;
  args.options.sm_margin = sm_margin;
  args.num_splits = num_splits;
  return args;
}

void forward_with_kvcache(const InArray& q, const OutArray& k_cache, const OutArray& v_cache,
                          const InArray& cache_seqlens, const OutArray& out, const std::optional<OutArray>& lse,
                          const OptIn& k_new, const OptIn& v_new, const OptIn& page_table, const OptIn& cache_batch_idx,
                          const OptIn& cache_leftpad, const OptIn& rotary_cos, const OptIn& rotary_sin,
                          const OptIn& rotary_seqlens, bool rotary_interleaved, const OptIn& sinks,
                          const OptIn& q_descale, const OptIn& k_descale, const OptIn& v_descale, float softmax_scale,
                          bool causal, int window_left, int window_right, float softcap, int attention_chunk,
                          int num_splits, const std::optional<OutArray>& workspace, std::uintptr_t stream,
                          int num_threads, int sm_margin) {
  Placement where;
  KvCacheArgs args = kvcache_args(q, k_cache, v_cache, cache_seqlens, out, lse, k_new, v_new, page_table,
                                  cache_batch_idx, cache_leftpad, rotary_cos, rotary_sin, rotary_seqlens,
                                  rotary_interleaved, sinks, q_descale, k_descale, v_descale, softmax_scale, causal,
                                  window_left, window_right, softcap, attention_chunk, num_splits, sm_margin, where);
  // Only the GPU path has a workspace; a missing one is the C++ layer's error to report.
  if (workspace && where.on_cuda()) {
    const ByteBuffer buffer = to_bytes("workspace", *workspace, where);
    args.workspace = buffer.data;
    args.workspace_bytes = buffer.bytes;
  }

  Status status;
  {
    nb::gil_scoped_release no_gil;
    if (where.on_host()) {
      status = cpu::forward_with_kvcache(args, cpu::Options{num_threads});
    } else {
      status = on_device(where.device_id(),
                         [&] { return fa3::forward_with_kvcache(args, reinterpret_cast<cudaStream_t>(stream)); });
    }
  }
  raise_if_error(status);
}

std::size_t kvcache_workspace_size(const InArray& q, const OutArray& k_cache, const OutArray& v_cache,
                                   const InArray& cache_seqlens, const OutArray& out,
                                   const std::optional<OutArray>& lse, const OptIn& k_new, const OptIn& v_new,
                                   const OptIn& page_table, const OptIn& cache_batch_idx, const OptIn& cache_leftpad,
                                   const OptIn& rotary_cos, const OptIn& rotary_sin, const OptIn& rotary_seqlens,
                                   bool rotary_interleaved, const OptIn& sinks, const OptIn& q_descale,
                                   const OptIn& k_descale, const OptIn& v_descale, float softmax_scale, bool causal,
                                   int window_left, int window_right, float softcap, int attention_chunk,
                                   int num_splits, int sm_margin) {
  Placement where;
  const KvCacheArgs args = kvcache_args(q, k_cache, v_cache, cache_seqlens, out, lse, k_new, v_new, page_table,
                                        cache_batch_idx, cache_leftpad, rotary_cos, rotary_sin, rotary_seqlens,
                                        rotary_interleaved, sinks, q_descale, k_descale, v_descale, softmax_scale,
                                        causal, window_left, window_right, softcap, attention_chunk, num_splits,
                                        sm_margin, where);
  // The CPU path takes no workspace.
  if (where.on_host()) return 0;
  std::size_t bytes = 0;
  Status status;
  {
    nb::gil_scoped_release no_gil;
    status = on_device(where.device_id(), [&] { return fa3::kvcache_workspace_size(args, &bytes); });
  }
  raise_if_error(status);
  return bytes;
}

void combine(const InArray& out_partial, const InArray& lse_partial, const OutArray& out,
             const std::optional<OutArray>& lse, std::uintptr_t stream) {
  Placement where;
  CombineArgs args;
  args.out_partial = to_view("out_partial", out_partial, where);
  args.lse_partial = to_view("lse_partial", lse_partial, where);
  args.out = to_view("out", out, where);
  if (lse) args.lse = to_view("lse", *lse, where);
  Status status;
  {
    nb::gil_scoped_release no_gil;
    if (where.on_host()) {
      status = cpu::combine(args);
    } else {
      status = on_device(where.device_id(), [&] { return fa3::combine(args, reinterpret_cast<cudaStream_t>(stream)); });
    }
  }
  raise_if_error(status);
}

}  // namespace

void register_kvcache_bindings(nb::module_& m) {
  m.def("forward_with_kvcache", &forward_with_kvcache, "q"_a, "k_cache"_a, "v_cache"_a, "cache_seqlens"_a, "out"_a,
        "lse"_a.none(), nb::kw_only(), "k_new"_a.none() = nb::none(), "v_new"_a.none() = nb::none(),
        "page_table"_a.none() = nb::none(), "cache_batch_idx"_a.none() = nb::none(),
        "cache_leftpad"_a.none() = nb::none(), "rotary_cos"_a.none() = nb::none(), "rotary_sin"_a.none() = nb::none(),
        "rotary_seqlens"_a.none() = nb::none(), "rotary_interleaved"_a = true, "sinks"_a.none() = nb::none(),
        "q_descale"_a.none() = nb::none(), "k_descale"_a.none() = nb::none(), "v_descale"_a.none() = nb::none(),
        "softmax_scale"_a = 0.f, "causal"_a = false, "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.f,
        "attention_chunk"_a = 0, "num_splits"_a = 0, "workspace"_a.none() = nb::none(), "stream"_a = 0,
        "num_threads"_a = 0, "sm_margin"_a = 0,
        "Attention over a KV cache (FlashAttention-3's flash_attn_with_kvcache): appends k_new / v_new into\n"
        "k_cache / v_cache in place at cache_seqlens (rotated when rotary_cos / rotary_sin are given), then\n"
        "writes out (batch, seqlen_q, nheads, head_dim_v) and lse (batch, nheads, seqlen_q) unless None.\n"
        "e4m3 q, caches and new rows take q/k/v_descale (batch, nheads_kv) fp32, out bf16 or fp16.\n"
        "The cache is contiguous (batch_cache, seqlen_cache, nheads_kv, head_dim) or, with page_table (batch,\n"
        "max_pages_per_seq) int32, paged (num_pages, page_size, nheads_kv, head_dim). Host tensors, or CUDA\n"
        "tensors of one device in a build with the GPU KV-cache path (build_info()['gpu_kvcache']), enqueued on\n"
        "`stream` with `workspace` a 1-d uint8 array on that device of at least kvcache_workspace_size() bytes,\n"
        "256-byte aligned.");
  m.def("kvcache_workspace_size", &kvcache_workspace_size, "q"_a, "k_cache"_a, "v_cache"_a, "cache_seqlens"_a, "out"_a,
        "lse"_a.none(), nb::kw_only(), "k_new"_a.none() = nb::none(), "v_new"_a.none() = nb::none(),
        "page_table"_a.none() = nb::none(), "cache_batch_idx"_a.none() = nb::none(),
        "cache_leftpad"_a.none() = nb::none(), "rotary_cos"_a.none() = nb::none(), "rotary_sin"_a.none() = nb::none(),
        "rotary_seqlens"_a.none() = nb::none(), "rotary_interleaved"_a = true, "sinks"_a.none() = nb::none(),
        "q_descale"_a.none() = nb::none(), "k_descale"_a.none() = nb::none(), "v_descale"_a.none() = nb::none(),
        "softmax_scale"_a = 0.f, "causal"_a = false, "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.f,
        "attention_chunk"_a = 0, "num_splits"_a = 0, "sm_margin"_a = 0,
        "Bytes of workspace that forward_with_kvcache() needs for these arguments: for CUDA tensors after\n"
        "validating them as it does (except the workspace), 0 for host tensors.");
  m.def("combine", &combine, "out_partial"_a, "lse_partial"_a, "out"_a, "lse"_a.none(), nb::kw_only(), "stream"_a = 0,
        "Merges split partial results exactly: out_partial (num_splits, rows, nheads, head_dim) fp32 and\n"
        "lse_partial (num_splits, rows, nheads) fp32 into out (rows, nheads, head_dim) and lse (rows, nheads)\n"
        "unless None. Host tensors, or CUDA tensors of one device (enqueued on `stream`).");
}

}  // namespace fa3::python
