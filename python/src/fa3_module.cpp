// fa3 Python extension (fa3._C): the public C++ API over DLPack tensors.
//
// Framework-neutral on purpose: tensors arrive through DLPack (PyTorch, NumPy, CuPy,
// JAX...), the caller's CUDA stream arrives as an integer, and outputs (and the
// workspaces of the GPU paths) are allocated by the caller. Host tensors run
// fa3::cpu::*, CUDA tensors fa3::* on their own device.
// A rejected call raises ValueError (invalid argument), NotImplementedError (not
// supported) or RuntimeError (CUDA or internal error) with the library's message.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "call_status.h"
#include "dlpack_views.h"
#include "fa3/fa3.h"
#include "kvcache_bindings.h"
#include "tune_bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace fa3::python {
namespace {

AttentionOptions make_options(float softmax_scale, bool causal, int window_left, int window_right, float softcap,
                              int attention_chunk, int sm_margin) {
  AttentionOptions o;
  o.sm_margin = sm_margin;
  o.softmax_scale = softmax_scale;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = softcap;
  o.attention_chunk = attention_chunk;
  return o;
}

cudaStream_t as_stream(std::uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

// The index tensors (int32) and bounds of a variable-length call; without cu_seqlens_q
// a fixed-length call, whose other fields the C++ layer requires unset.
struct VarlenInputs {
  std::optional<InArray> cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;

  VarlenArgs to_args(Placement& where) const {
    VarlenArgs v;
    if (cu_seqlens_q) v.cu_seqlens_q = to_view("cu_seqlens_q", *cu_seqlens_q, where);
    if (cu_seqlens_k) v.cu_seqlens_k = to_view("cu_seqlens_k", *cu_seqlens_k, where);
    if (seqused_q) v.seqused_q = to_view("seqused_q", *seqused_q, where);
    if (seqused_k) v.seqused_k = to_view("seqused_k", *seqused_k, where);
    v.max_seqlen_q = max_seqlen_q;
    v.max_seqlen_k = max_seqlen_k;
    return v;
  }
};

// The scales of an FP8 call (fa3/attention.h's Fp8Args), each optional.
struct Fp8Inputs {
  std::optional<InArray> q_descale, k_descale, v_descale, q_block_scale, k_block_scale, v_block_scale;
  int block_rows = 128;

  Fp8Args to_args(Placement& where) const {
    Fp8Args f;
    const std::pair<const char*, std::pair<const std::optional<InArray>*, TensorView*>> fields[] = {
        {"q_descale", {&q_descale, &f.q_descale}},         {"k_descale", {&k_descale, &f.k_descale}},
        {"v_descale", {&v_descale, &f.v_descale}},         {"q_block_scale", {&q_block_scale, &f.q_block_scale}},
        {"k_block_scale", {&k_block_scale, &f.k_block_scale}}, {"v_block_scale", {&v_block_scale, &f.v_block_scale}},
    };
    for (const auto& [name, field] : fields) {
      if (*field.first) *field.second = to_view(name, **field.first, where);
    }
    f.block_rows = block_rows;
    return f;
  }
};

// The tensors and options of a forward call; `where` learns their device. The size
// query writes nothing, so it takes out and lse read-only (Out = InArray).
template <class Out>
ForwardArgs forward_args(const InArray& q, const InArray& k, const InArray& v, const Out& out,
                         const std::optional<Out>& lse, const std::optional<InArray>& sinks, float softmax_scale,
                         bool causal, int window_left, int window_right, float softcap, int attention_chunk,
                         int sm_margin, const VarlenInputs& varlen, const Fp8Inputs& fp8, Placement& where) {
  ForwardArgs args;
  args.q = to_view("q", q, where);
  args.k = to_view("k", k, where);
  args.v = to_view("v", v, where);
  args.out = to_view("out", out, where);
  if (lse) args.lse = to_view("lse", *lse, where);
  if (sinks) args.sinks = to_view("sinks", *sinks, where);
  args.options = make_options(softmax_scale, causal, window_left, window_right, softcap, attention_chunk, sm_margin);
  args.varlen = varlen.to_args(where);
  args.fp8 = fp8.to_args(where);
  return args;
}

void forward(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
             const std::optional<OutArray>& lse, const std::optional<InArray>& sinks, float softmax_scale, bool causal,
             int window_left, int window_right, float softcap, int attention_chunk,
             const std::optional<OutArray>& workspace, std::uintptr_t stream, int num_threads,
             const std::optional<InArray>& cu_seqlens_q, const std::optional<InArray>& cu_seqlens_k,
             const std::optional<InArray>& seqused_q, const std::optional<InArray>& seqused_k, int max_seqlen_q,
             int max_seqlen_k, const std::optional<InArray>& q_descale, const std::optional<InArray>& k_descale,
             const std::optional<InArray>& v_descale, const std::optional<InArray>& q_block_scale,
             const std::optional<InArray>& k_block_scale, const std::optional<InArray>& v_block_scale,
             int block_rows, int sm_margin) {
  Placement where;
  ForwardArgs args = forward_args(
      q, k, v, out, lse, sinks, softmax_scale, causal, window_left, window_right, softcap, attention_chunk, sm_margin,
      VarlenInputs{cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k},
      Fp8Inputs{q_descale, k_descale, v_descale, q_block_scale, k_block_scale, v_block_scale, block_rows}, where);
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
      status = cpu::forward(args, cpu::Options{num_threads});
    } else {
      status = on_device(where.device_id(), [&] { return fa3::forward(args, as_stream(stream)); });
    }
  }
  raise_if_error(status);
}

std::size_t forward_workspace_size(const InArray& q, const InArray& k, const InArray& v, const InArray& out,
                                   const std::optional<InArray>& lse, const std::optional<InArray>& sinks,
                                   float softmax_scale, bool causal, int window_left, int window_right, float softcap,
                                   int attention_chunk, const std::optional<InArray>& cu_seqlens_q,
                                   const std::optional<InArray>& cu_seqlens_k, const std::optional<InArray>& seqused_q,
                                   const std::optional<InArray>& seqused_k, int max_seqlen_q, int max_seqlen_k,
                                   const std::optional<InArray>& q_descale, const std::optional<InArray>& k_descale,
                                   const std::optional<InArray>& v_descale, const std::optional<InArray>& q_block_scale,
                                   const std::optional<InArray>& k_block_scale,
                                   const std::optional<InArray>& v_block_scale, int block_rows, int sm_margin) {
  Placement where;
  const ForwardArgs args = forward_args(
      q, k, v, out, lse, sinks, softmax_scale, causal, window_left, window_right, softcap, attention_chunk, sm_margin,
      VarlenInputs{cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k},
      Fp8Inputs{q_descale, k_descale, v_descale, q_block_scale, k_block_scale, v_block_scale, block_rows}, where);
  // The CPU path takes no workspace.
  if (where.on_host()) return 0;
  std::size_t bytes = 0;
  raise_if_error(fa3::forward_workspace_size(args, &bytes));
  return bytes;
}

// The tensors and options of a backward call; `where` learns their device. The size
// query writes nothing, so it takes dq, dk, dv and dsinks read-only (Grad = InArray).
template <class Grad>
BackwardArgs backward_args(const InArray& dout, const InArray& q, const InArray& k, const InArray& v,
                           const InArray& out, const InArray& lse, const Grad& dq, const Grad& dk, const Grad& dv,
                           const std::optional<InArray>& sinks, const std::optional<Grad>& dsinks, float softmax_scale,
                           bool causal, int window_left, int window_right, float softcap, bool deterministic,
                           int attention_chunk, int sm_margin, const VarlenInputs& varlen, Placement& where) {
  BackwardArgs args;
  args.q = to_view("q", q, where);
  args.k = to_view("k", k, where);
  args.v = to_view("v", v, where);
  args.out = to_view("out", out, where);
  args.dout = to_view("dout", dout, where);
  args.lse = to_view("lse", lse, where);
  args.dq = to_view("dq", dq, where);
  args.dk = to_view("dk", dk, where);
  args.dv = to_view("dv", dv, where);
  if (sinks) args.sinks = to_view("sinks", *sinks, where);
  if (dsinks) args.dsinks = to_view("dsinks", *dsinks, where);
  args.options = make_options(softmax_scale, causal, window_left, window_right, softcap, attention_chunk, sm_margin);
  args.deterministic = deterministic;
  args.varlen = varlen.to_args(where);
  return args;
}

void backward(const InArray& dout, const InArray& q, const InArray& k, const InArray& v, const InArray& out,
              const InArray& lse, const OutArray& dq, const OutArray& dk, const OutArray& dv,
              const std::optional<InArray>& sinks, const std::optional<OutArray>& dsinks, float softmax_scale,
              bool causal, int window_left, int window_right, float softcap, bool deterministic, int attention_chunk,
              const std::optional<OutArray>& workspace, std::uintptr_t stream, int num_threads,
              const std::optional<InArray>& cu_seqlens_q, const std::optional<InArray>& cu_seqlens_k,
              const std::optional<InArray>& seqused_q, const std::optional<InArray>& seqused_k, int max_seqlen_q,
              int max_seqlen_k, int sm_margin) {
  Placement where;
  const VarlenInputs varlen{cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k};
  BackwardArgs args = backward_args(dout, q, k, v, out, lse, dq, dk, dv, sinks, dsinks, softmax_scale, causal,
                                    window_left, window_right, softcap, deterministic, attention_chunk, sm_margin,
                                    varlen, where);
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
      status = cpu::backward(args, cpu::Options{num_threads});
    } else {
      status = on_device(where.device_id(), [&] { return fa3::backward(args, as_stream(stream)); });
    }
  }
  raise_if_error(status);
}

std::size_t backward_workspace_size(const InArray& dout, const InArray& q, const InArray& k, const InArray& v,
                                    const InArray& out, const InArray& lse, const InArray& dq, const InArray& dk,
                                    const InArray& dv, const std::optional<InArray>& sinks,
                                    const std::optional<InArray>& dsinks, float softmax_scale, bool causal,
                                    int window_left, int window_right, float softcap, bool deterministic,
                                    int attention_chunk, const std::optional<InArray>& cu_seqlens_q,
                                    const std::optional<InArray>& cu_seqlens_k, const std::optional<InArray>& seqused_q,
                                    const std::optional<InArray>& seqused_k, int max_seqlen_q, int max_seqlen_k,
                                    int sm_margin) {
  Placement where;
  const VarlenInputs varlen{cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k};
  const BackwardArgs args =
      backward_args(dout, q, k, v, out, lse, dq, dk, dv, sinks, dsinks, softmax_scale, causal, window_left,
                    window_right, softcap, deterministic, attention_chunk, sm_margin, varlen, where);
  // The CPU path takes no workspace; answering 0 lets a caller ask before every
  // backward() whatever the device.
  if (where.on_host()) return 0;
  std::size_t bytes = 0;
  raise_if_error(fa3::backward_workspace_size(args, &bytes));
  return bytes;
}

void fp8_quantize(const InArray& input, const OutArray& output, const OutArray& scale, int block_rows, bool hadamard,
                  std::uint64_t seed, std::uintptr_t stream, const std::optional<InArray>& cu_seqlens,
                  int max_seqlen) {
  Placement where;
  fp8::QuantizeArgs args;
  args.input = to_view("input", input, where);
  args.output = to_view("output", output, where);
  args.scale = to_view("scale", scale, where);
  args.block_rows = block_rows;
  args.hadamard = hadamard;
  args.seed = seed;
  if (cu_seqlens) args.cu_seqlens = to_view("cu_seqlens", *cu_seqlens, where);
  args.max_seqlen = max_seqlen;
  Status status;
  {
    nb::gil_scoped_release no_gil;
    if (where.on_host()) {
      status = cpu::quantize(args);
    } else {
      status = on_device(where.device_id(), [&] { return fp8::quantize(args, as_stream(stream)); });
    }
  }
  raise_if_error(status);
}

// Host tensors run fa3::cpu's merge, CUDA tensors (all on one device) the merge kernel on
// `stream`, with that device made current for the call.
void merge_attention_states(const std::vector<InArray>& outs, const std::vector<InArray>& lses, const OutArray& out,
                            const OutArray& lse, std::uintptr_t stream) {
  Placement where;
  MergeArgs args;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    args.outs.push_back(to_view(("outs[" + std::to_string(i) + "]").c_str(), outs[i], where));
  }
  for (std::size_t i = 0; i < lses.size(); ++i) {
    args.lses.push_back(to_view(("lses[" + std::to_string(i) + "]").c_str(), lses[i], where));
  }
  args.out = to_view("out", out, where);
  args.lse = to_view("lse", lse, where);
  Status status;
  {
    nb::gil_scoped_release no_gil;
    if (where.on_host()) {
      status = cpu::merge_attention_states(args);
    } else {
      status = on_device(where.device_id(),
                         [&] { return fa3::merge_attention_states(args, reinterpret_cast<cudaStream_t>(stream)); });
    }
  }
  raise_if_error(status);
}

nb::dict build_info_dict() {
  const BuildInfo& b = fa3::build_info();
  nb::dict d;
  d["version"] = b.version;
  d["cuda_version"] = b.cuda_version;
  d["cutlass_version"] = b.cutlass_version;
  d["head_dims"] = b.head_dims;
  d["dtypes"] = b.dtypes;
  d["gpu_kernels"] = b.gpu_kernels;
  d["gpu_varlen"] = b.gpu_varlen;
  d["gpu_varlen_backward_head_dims"] = b.gpu_varlen_backward_head_dims;
  d["gpu_kvcache"] = b.gpu_kvcache;
  d["gpu_fp8"] = b.gpu_fp8;
  d["gpu_fp8_varlen"] = b.gpu_fp8_varlen;
  d["gpu_fp8_kvcache"] = b.gpu_fp8_kvcache;
  d["gpu_fp8_vt_smem"] = b.gpu_fp8_vt_smem;
  d["gpu_kvcache_cluster_merge"] = b.gpu_kvcache_cluster_merge;
  return d;
}

nb::dict device_info_dict(int index) {
  DeviceInfo info;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) cudaGetLastError();
  if (index >= 0 && err == cudaSuccess && index >= count) {
    info.error = "CUDA device " + std::to_string(index) + " does not exist (" + std::to_string(count) + " present)";
  } else if (index >= 0 && err == cudaSuccess) {
    Status s = on_device(index, [&] {
      info = current_device();
      return Status::ok();
    });
    if (!s.is_ok()) info.error = s.message();
  } else {
    info = current_device();
  }
  nb::dict d;
  d["present"] = info.present;
  d["index"] = info.index;
  d["name"] = info.name;
  d["compute_capability"] = nb::make_tuple(info.cc_major, info.cc_minor);
  d["sm_count"] = info.sm_count;
  d["global_memory_bytes"] = info.global_memory_bytes;
  d["l2_bytes"] = info.l2_bytes;
  d["max_smem_per_block_optin"] = info.max_smem_per_block_optin;
  d["is_hopper"] = info.is_hopper();
  d["error"] = info.error;
  return d;
}

}  // namespace
}  // namespace fa3::python

NB_MODULE(_C, m) {
  using namespace fa3::python;
  m.doc() = "fa3 exact attention over DLPack tensors (host tensors: CPU path; CUDA tensors: Hopper kernels)";

  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), nb::kw_only(), "sinks"_a.none() = nb::none(),
        "softmax_scale"_a = 0.f, "causal"_a = false, "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.f,
        "attention_chunk"_a = 0, "workspace"_a.none() = nb::none(), "stream"_a = 0, "num_threads"_a = 0,
        "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "seqused_q"_a.none() = nb::none(),
        "seqused_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0,
        "q_descale"_a.none() = nb::none(), "k_descale"_a.none() = nb::none(), "v_descale"_a.none() = nb::none(),
        "q_block_scale"_a.none() = nb::none(), "k_block_scale"_a.none() = nb::none(),
        "v_block_scale"_a.none() = nb::none(), "block_rows"_a = 128, "sm_margin"_a = 0,
        "Attention forward pass: writes out (and lse unless None). q (batch, seqlen_q, nheads, head_dim); k\n"
        "(batch, seqlen_k, nheads_kv, head_dim); v (batch, seqlen_k, nheads_kv, head_dim_v); out (batch, seqlen_q,\n"
        "nheads, head_dim_v); lse (batch, nheads, seqlen_q) fp32. sinks: None, or one fp32\n"
        "attention-sink logit per query head (nheads,); lse then includes the sink. softmax_scale 0 means\n"
        "1/sqrt(head_dim). stream: the CUDA stream (as an integer) for CUDA tensors; num_threads: the CPU\n"
        "path's thread count (0: all cores). Each is ignored on the other path. Variable-length batches\n"
        "(on CUDA tensors in a build with the varlen GPU paths): cu_seqlens_q and cu_seqlens_k, int32 (batch + 1),\n"
        "with optional seqused_q and seqused_k, int32 (batch), and max_seqlen_q / max_seqlen_k; q, k, v and out\n"
        "are then (total, nheads, head_dim) and lse (nheads, total_q), as in FlashAttention-3's\n"
        "flash_attn_varlen_func. FP8: e4m3 q, k, v with a bf16 or fp16 out, and optional fp32 scales:\n"
        "q/k/v_descale (batch, nheads_kv), and block scales q_block_scale (batch, nheads, ceil(seqlen_q /\n"
        "block_rows)), k/v_block_scale (batch, nheads_kv, ceil(seqlen_k / block_rows)) (fa3/attention.h); on CUDA\n"
        "tensors in a build with the FP8 kernels. sm_margin: SMs the GPU kernels leave free. workspace: for CUDA\n"
        "tensors, a 1-d uint8 array on their device\n"
        "of at least forward_workspace_size() bytes (0 for all but FP8 calls), 256-byte aligned, allocated until\n"
        "the call's work on the stream is done; host tensors ignore it.");
  m.def("forward_workspace_size", &forward_workspace_size, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), nb::kw_only(),
        "sinks"_a.none() = nb::none(), "softmax_scale"_a = 0.f, "causal"_a = false, "window_left"_a = -1,
        "window_right"_a = -1, "softcap"_a = 0.f, "attention_chunk"_a = 0, "cu_seqlens_q"_a.none() = nb::none(),
        "cu_seqlens_k"_a.none() = nb::none(), "seqused_q"_a.none() = nb::none(), "seqused_k"_a.none() = nb::none(),
        "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "q_descale"_a.none() = nb::none(),
        "k_descale"_a.none() = nb::none(), "v_descale"_a.none() = nb::none(), "q_block_scale"_a.none() = nb::none(),
        "k_block_scale"_a.none() = nb::none(), "v_block_scale"_a.none() = nb::none(), "block_rows"_a = 128,
        "sm_margin"_a = 0, "Bytes of workspace that forward() needs for these arguments: for CUDA tensors after validating them as\n"
        "forward() does (same errors), 0 for host tensors. Reads no tensor data and enqueues nothing.");
  m.def(
      "hadamard_signs",
      [](std::uint64_t seed, int head_dim) {
        std::vector<bool> negative(static_cast<std::size_t>(head_dim > 0 ? head_dim : 0));
        for (int c = 0; c < head_dim; ++c) negative[static_cast<std::size_t>(c)] = fa3::fp8::hadamard_sign(seed, c);
        return negative;
      },
      "seed"_a, "head_dim"_a, "Whether each column's sign in fp8_quantize's Hadamard transform is -1 for `seed`.");
  m.def("fp8_quantize", &fp8_quantize, "input"_a, "output"_a, "scale"_a, nb::kw_only(), "block_rows"_a = 128,
        "hadamard"_a = false, "seed"_a = 0, "stream"_a = 0, "cu_seqlens"_a.none() = nb::none(), "max_seqlen"_a = 0,
        "FP8 quantization (fa3/fp8.h): writes output, e4m3 of input's shape (batch, seqlen, nheads, head_dim),\n"
        "and scale, fp32 (batch, nheads, ceil(seqlen / block_rows)) absmax / 448 per block of rows, after the\n"
        "random-sign Hadamard transform of seed `seed` along head_dim when hadamard is set. With cu_seqlens\n"
        "(int32, batch + 1) a varlen batch: input (total, nheads, head_dim), blocks from each sequence's first\n"
        "row, scale (batch, nheads, ceil(max_seqlen / block_rows)). Host tensors: the CPU version; CUDA\n"
        "tensors: one kernel on `stream`.");
  m.def("backward", &backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, nb::kw_only(),
        "sinks"_a.none() = nb::none(), "dsinks"_a.none() = nb::none(), "softmax_scale"_a = 0.f, "causal"_a = false,
        "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.f, "deterministic"_a = false,
        "attention_chunk"_a = 0, "workspace"_a.none() = nb::none(), "stream"_a = 0, "num_threads"_a = 0,
        "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "seqused_q"_a.none() = nb::none(),
        "seqused_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "sm_margin"_a = 0,
        "Attention backward pass: writes dq, dk, dv from the forward's out and lse and the gradient dout.\n"
        "sinks: the forward's (or None); dsinks: None, or an fp32 (nheads,) array to receive their gradient.\n"
        "deterministic: bitwise reproducible gradients (slower on the GPU). workspace: for CUDA tensors, a\n"
        "1-d uint8 array on their device of at least backward_workspace_size() bytes, 256-byte aligned; its\n"
        "contents do not matter, and it must stay allocated until the call's work on the stream is done.\n"
        "Host tensors ignore it. The varlen arguments are the forward's.");
  m.def("backward_workspace_size", &backward_workspace_size, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a,
        "dk"_a, "dv"_a, nb::kw_only(), "sinks"_a.none() = nb::none(), "dsinks"_a.none() = nb::none(),
        "softmax_scale"_a = 0.f, "causal"_a = false, "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.f,
        "deterministic"_a = false, "attention_chunk"_a = 0, "cu_seqlens_q"_a.none() = nb::none(),
        "cu_seqlens_k"_a.none() = nb::none(), "seqused_q"_a.none() = nb::none(), "seqused_k"_a.none() = nb::none(),
        "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "sm_margin"_a = 0,
        "Bytes of workspace that backward() needs for these arguments: for CUDA tensors after validating them\n"
        "as backward() does (same errors), 0 for host tensors. Reads no tensor data and enqueues nothing.");
  m.def("merge_attention_states", &merge_attention_states, "outs"_a, "lses"_a, "out"_a, "lse"_a, nb::kw_only(),
        "stream"_a = 0,
        "Exact merge of partial attention results: writes out = sum_i exp(lses[i] - lse) * outs[i] and\n"
        "lse = log(sum_i exp(lses[i])), in fp32. outs[i] and out (batch, seqlen, nheads, head_dim), each fp32,\n"
        "fp16 or bf16 of its own; lses[i] and lse (batch, nheads, seqlen) fp32. A row with lse -inf in every\n"
        "part gives 0 and -inf.\n"
        "Host tensors, or CUDA tensors of one device (at most 128 parts; enqueued on `stream`).");
  m.def("build_info", &build_info_dict, "What this build holds: version, CUDA and CUTLASS versions, kernel list.");
  m.def("device_info", &device_info_dict, "index"_a = -1,
        "Properties of CUDA device `index` (-1: the current device); never raises without a GPU.");
  register_tune_bindings(m);
  register_kvcache_bindings(m);
}
