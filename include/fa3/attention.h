// fa3 — exact attention: argument structs and entry points.
//
// Layout (FlashAttention's): q is (batch, seqlen_q, nheads_q, head_dim); k is (batch,
// seqlen_k, nheads_kv, head_dim); v is (batch, seqlen_k, nheads_kv, head_dim_v); out is
// (batch, seqlen_q, nheads_q, head_dim_v); lse is (batch, nheads_q, seqlen_q) in fp32,
// natural log. Every tensor's last dimension must be contiguous (an e4m3 v's keys may
// be instead, see FP8 below); the other strides are free (16-byte aligned for the GPU
// path).
//
// V's head dim may differ from q's and k's, as in DeepSeek-V3's prefill (192, 128) or
// (64, 512): scores are q . k over head_dim, and out, dout and dv have v's head_dim_v.
// fa3::cpu runs any head_dim_v from 1 to 512; the GPU entry points refuse one that
// differs from head_dim for now (kNotSupported, naming v).
//
// Masking follows FlashAttention 2/3: query i may see key j when
//   i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right,
// a negative window side meaning "unbounded"; causal is window_right = 0, i.e. the mask is
// aligned to the bottom-right corner when seqlen_q != seqlen_k. With attention_chunk = C
// > 0 (chunked attention, as Llama 4 uses) query i also sees only the keys of its own
// chunk: j / C == (i + seqlen_k - seqlen_q) / C, rounding down. A query row that sees no
// key gets output 0 and lse -inf.
//
// Attention sinks (optional, gpt-oss style): one fp32 logit sink_h per query head that
// joins every row's softmax denominator without a value, as given (neither scaled nor
// capped). For row i of head h, with s_ij its scores (scaled, softcapped, masked):
//   L_i = log(exp(sink_h) + sum_j exp(s_ij)),   P_ij = exp(s_ij - L_i),   out_i = sum_j P_ij v_j,
// so a row's probabilities sum to less than 1, and the lse returned (and read back by
// the backward) is L_i: it includes the sink. A row that sees no key gets output 0 and
// lse = sink_h (only the sink remains), and its dq is 0. A sink of -inf is no sink.
// The backward's gradient of the sinks, with D_i = rowsum(dout_i * out_i), is
//   dsinks_h = -sum over the rows i of head h, in every batch, of exp(sink_h - L_i) * D_i.
// Both fa3::cpu and the GPU entry points implement sinks (on the GPU, every kernel family).
//
// Variable-length batches (varlen, FlashAttention-3's flash_attn_varlen_func): with
// VarlenArgs::cu_seqlens_q given, the batch's sequences are packed one after another
// along one row dimension. q is (total_q, nheads_q, head_dim), k (total_k, nheads_kv,
// head_dim), v (total_k, nheads_kv, head_dim_v), out (total_q, nheads_q, head_dim_v), lse
// (nheads_q, total_q); the gradients have their inputs' layouts. Sequence b's query rows
// are [cu_seqlens_q[b], cu_seqlens_q[b + 1]), its keys likewise in cu_seqlens_k, and with
// seqused_q / seqused_k only the first seqused[b] of them take part. Every rule above
// holds per sequence with that sequence's own lengths (the causal diagonal aligned to the
// bottom-right corner of each). Query rows that take part in no sequence (past seqused,
// or past cu_seqlens_q[batch]) get out 0, lse -inf and dq 0; keys that take part in none
// get dk and dv 0. A sequence may be empty; one whose keys are empty has out 0 and lse
// -inf (its sink's logit, with sinks). fa3::cpu runs varlen calls. fa3::forward runs them
// in a build with the GPU varlen paths (BuildInfo::gpu_varlen, the FA3_GPU_VARLEN option,
// on by default) and refuses them otherwise (kNotSupported, naming cu_seqlens_q);
// fa3::backward likewise, whatever the mask, at the kernel head dims of
// BuildInfo::gpu_varlen_backward_head_dims (the FA3_BWD_VARLEN_HEAD_DIMS option, 128 by
// default; a varlen call of another head dim is refused with kNotSupported naming
// cu_seqlens_q, also in a build with the option).
//
// What is checked where: fa3::cpu reads the index tensors and checks every rule on their
// values (offsets from 0, non-decreasing, within the totals; seqused within each
// sequence's length; max_seqlen at least the longest sequence). The GPU entry points
// check the index tensors' dtype, rank, length, contiguity, alignment and device, and that
// max_seqlen_q / max_seqlen_k are >= 0, but not their values, which live in device memory
// and would cost a synchronization to read: as in FlashAttention-3, those rules are the
// caller's contract there, and a call that breaks them leaves rows unwritten or reads out
// of bounds.
//
// FP8 (e4m3) forward: q, k and v in DType::kFloat8E4M3 hold codes x whose real values are
// x * scale, the scale being the product of the scales Fp8Args gives for the row (each
// 1 when not given): a descale per (batch, kv head), as FlashAttention-3 takes them, and
// with block quantization one scale per block of block_rows rows of one (batch, head)
// (fa3/fp8.h writes both the codes and the block scales). out is bf16 or fp16, lse fp32.
// The numerics the FP8 kernel implements, and fa3::cpu runs (the oracle it is checked
// against): S = (q x) . (k x) in fp32 with the scales applied (the kernel applies them to
// S, the CPU path when it loads a row: equal up to fp32 rounding); P = exp(s - max) is
// rounded to e4m3 after a shift by 2^8 (P * 256 lies in [0, 256], inside e4m3's range,
// so weights down to 2^-17 survive rather than only those above 2^-10), while the row
// sum adds the unrounded fp32 weights, as FlashAttention-3's softmax does (it sums
// before it converts); V's contribution (rounded P times scaled v) accumulates in fp32,
// and out = acc / sum. As in any online softmax, a weight is formed (and so rounded)
// against the row's running max when its key block is processed, so the rounding of P
// depends on the key tile (64 keys on the CPU path): the kernel is held to the FP8
// accuracy rule against this oracle, not to bitwise equality. fa3::cpu runs FP8 calls,
// varlen ones too: their scales are per sequence (Fp8Args). fa3::forward runs them in a
// build with the FP8 kernels (BuildInfo::gpu_fp8, the FA3_GPU_FP8 option; kNotSupported
// naming q otherwise): head dims up to 256, plain and causal masks (no window, softcap or
// chunk), block_rows 128, with block scales finite and > 0 (as fp8::quantize writes
// them), out bf16 or fp16 as built (FA3_DTYPES); varlen ones only in a build with
// FA3_GPU_FP8_VARLEN (BuildInfo::gpu_fp8_varlen; kNotSupported naming q otherwise). An
// e4m3 v may have its keys contiguous (stride 1 along seqlen_k) instead of its head dim,
// FlashAttention-3's V_colmajor layout, on both paths. As FP8 wgmma reads V with its keys
// contiguous, the call first writes V transposed into the caller's workspace
// (ForwardArgs::workspace, of forward_workspace_size() bytes; a varlen call's holds every
// sequence's keys and 272 more per sequence), except in a build whose FP8 kernels
// transpose V in shared memory (BuildInfo::gpu_fp8_vt_smem, the FA3_FP8_VT_SMEM option):
// there FP8 calls need no workspace, and v's base and strides must be 16-byte multiples,
// as q's and k's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3 {

// Options shared by the forward and backward passes.
struct AttentionOptions {
  float softmax_scale = 0.f;  // 0 selects 1/sqrt(head_dim) (q's); otherwise must be finite and > 0
  bool causal = false;
  int window_left = -1;       // keys before the diagonal a query may see; -1: unbounded
  int window_right = -1;      // keys after the diagonal; -1: unbounded; causal means 0
  float softcap = 0.f;        // > 0: scores become softcap * tanh(scores / softcap)
  int attention_chunk = 0;    // > 0: queries see only keys of their own chunk (see above)
  // SMs the GPU kernels leave free for other work on the device, as FlashAttention-3's
  // sm_margin (e.g. communication kernels overlapping attention): the persistent
  // kernels run on the rest (at least one), KV-cache calls split for the rest. >= 0; it
  // never changes the result, and fa3::cpu ignores it.
  int sm_margin = 0;
};

// The index tensors of a varlen call (see above); all int32, contiguous, in the same
// memory as q. cu_seqlens_q.data == nullptr: a fixed-length call, and every other field
// must be left unset.
struct VarlenArgs {
  TensorView cu_seqlens_q;  // (batch + 1): 0, then non-decreasing, at most total_q
  TensorView cu_seqlens_k;  // (batch + 1): 0, then non-decreasing, at most total_k
  TensorView seqused_q;     // optional (batch): rows of each query sequence used, <= its length
  TensorView seqused_k;     // optional (batch): keys of each key sequence used, <= its length
  // The longest query and key sequence (after seqused); may be larger. fa3::cpu checks
  // them against the index tensors, which it reads on the host; on the GPU they are the
  // caller's contract (see above): the kernels run max_seqlen_q's query blocks for every
  // sequence.
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;

  bool enabled() const { return cu_seqlens_q.data != nullptr; }
};

// The scales of an FP8 forward call (see above); all fp32, any non-negative strides, in
// the same memory as q. Given only with e4m3 q, k, v; each optional (data == nullptr: 1).
struct Fp8Args {
  // FlashAttention-3's descales, one per (batch, kv head): (batch, nheads_kv). Query head
  // h reads q_descale[b][h / (nheads_q / nheads_kv)], as FlashAttention-3 does.
  TensorView q_descale;
  TensorView k_descale;
  TensorView v_descale;
  // Block quantization: one scale per block of block_rows consecutive rows of one
  // (batch, head): q_block_scale (batch, nheads_q, ceil(seqlen_q / block_rows)),
  // k_block_scale and v_block_scale (batch, nheads_kv, ceil(seqlen_k / block_rows)); the
  // last block may be short. All three or none. In a varlen call batch counts the
  // sequences, the blocks start at each sequence's first row, and seqlen_q / seqlen_k
  // are max_seqlen_q / max_seqlen_k (a shorter sequence leaves its last scales unread).
  TensorView q_block_scale;
  TensorView k_block_scale;
  TensorView v_block_scale;
  // The FP8 kernels read one scale per tile, so block_rows is their tile height on the
  // GPU: 128, a multiple of their block_m and block_n. fa3::cpu takes any block_rows >= 1.
  int block_rows = 128;

  bool has_block_scales() const {
    return q_block_scale.data != nullptr || k_block_scale.data != nullptr || v_block_scale.data != nullptr;
  }
  bool any() const {
    return has_block_scales() || q_descale.data != nullptr || k_descale.data != nullptr || v_descale.data != nullptr;
  }
};

struct ForwardArgs {
  TensorView q;
  TensorView k;
  TensorView v;
  // written; shape (batch, seqlen_q, nheads_q, head_dim_v); q's dtype, or bf16 / fp16 for e4m3 q
  TensorView out;
  TensorView lse;    // optional (data == nullptr to skip); written
  TensorView sinks;  // optional (data == nullptr: none); fp32 (nheads_q), any stride; read
  AttentionOptions options;
  VarlenArgs varlen;  // optional: a variable-length batch (see above)
  Fp8Args fp8;        // scales of e4m3 q, k, v (see above)
  // Device scratch memory of the GPU path, owned by the caller: at least
  // forward_workspace_size() bytes, 256-byte aligned. FP8 calls need it (V transposed),
  // unless the build's FP8 kernels transpose V themselves (BuildInfo::gpu_fp8_vt_smem);
  // every other call needs 0 bytes, and may leave it null. Its contents on entry do not
  // matter, and it is the caller's again once the call's work on the stream is done: no
  // memory is allocated inside a call, so a captured CUDA graph replays without
  // allocating. Ignored by the CPU path.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

struct BackwardArgs {
  TensorView q;
  TensorView k;
  TensorView v;
  TensorView out;     // the forward's output
  TensorView dout;    // gradient of the loss with respect to out; out's shape
  TensorView lse;     // the forward's lse
  TensorView dq;      // written; same dtype and shape as q
  TensorView dk;      // written; same dtype and shape as k
  TensorView dv;      // written; same dtype and shape as v
  TensorView sinks;   // optional (data == nullptr: none): the forward's sinks
  TensorView dsinks;  // optional, only with sinks; written: fp32 (nheads_q), any stride
  AttentionOptions options;
  VarlenArgs varlen;  // the forward's, for a variable-length batch
  // Fixes the order in which partial gradients are summed, so that repeated calls give
  // bitwise identical dq (and, with GQA/MQA, dk and dv). Costs some speed.
  bool deterministic = false;
  // Device scratch memory of the GPU path, owned by the caller: at least
  // backward_workspace_size() bytes, 256-byte aligned. It holds the fp32 dq accumulator,
  // the softmax statistics and, for GQA/MQA, fp32 dk/dv accumulators. Its contents on
  // entry do not matter, and it is the caller's again once the call's work on the stream
  // is done. No memory is allocated inside a call, so a call captured into a CUDA graph
  // replays without allocating. Ignored by the CPU path.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// Forward pass on the current CUDA device (a Hopper GPU), enqueued on `stream`.
// All pointers must be device memory of the current device. On any rejection no
// output is touched and nothing is enqueued.
Status forward(const ForwardArgs& args, cudaStream_t stream);

// The workspace fa3::forward needs for `args`, in bytes (0 for all but FP8 calls, and for
// those too where the FP8 kernels transpose V in shared memory).
// Validates `args` as forward() does, except the workspace and where the pointers live,
// so it can be asked before the workspace exists; reads no tensor data and enqueues
// nothing.
Status forward_workspace_size(const ForwardArgs& args, std::size_t* bytes);

// Backward pass on the current CUDA device (a Hopper GPU), enqueued on `stream`: writes
// dq, dk and dv (and dsinks when given). args.out and args.lse are the forward pass's.
// On any rejection no output is touched and nothing is enqueued.
Status backward(const BackwardArgs& args, cudaStream_t stream);

// The workspace fa3::backward needs for `args`, in bytes. Validates `args` as backward()
// does, except the workspace and where the pointers live, so it can be asked before the
// workspace exists; reads no tensor data and enqueues nothing.
Status backward_workspace_size(const BackwardArgs& args, std::size_t* bytes);

}  // namespace fa3
