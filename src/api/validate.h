// fa3 — argument validation shared by every entry point.
//
// Each rule has its own message naming the argument and the rule. Validation reads
// arguments only, so a rejected call leaves every output untouched.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"

namespace fa3 {

struct KvCacheProblem;

// Where the call will run, and so which rules apply.
struct ValidationTarget {
  enum class Space { kHost, kDevice };
  Space space = Space::kDevice;
  std::vector<DType> dtypes;      // accepted input dtypes
  // The head dims kernels were built for: any head dim up to the largest runs, on the
  // smallest at least as large. Empty: any in [1, max_head_dim].
  std::vector<int> head_dims;
  int max_head_dim = 256;
  // v's head dim (out's, dout's and dv's too) runs from 1 to max_head_dim_v; one that
  // differs from q's (DeepSeek-V3's (192, 128), or (64, 512)) only where
  // separate_head_dim_v is set, and a target without it refuses one by name.
  int max_head_dim_v = 256;
  bool separate_head_dim_v = false;
  bool supports_window = false;   // sliding window (non-causal part of the mask)
  bool supports_softcap = false;
  bool supports_sinks = false;    // attention sinks (the sinks and dsinks arguments)
  bool supports_chunk = false;    // attention_chunk > 0
  bool supports_varlen = false;   // variable-length batches (ForwardArgs::varlen)
  // e4m3 q, k, v in the forward (ForwardArgs::fp8); when fp8_block_rows > 0, the only
  // Fp8Args::block_rows it takes with block scales.
  bool supports_fp8 = false;
  int fp8_block_rows = 0;
  // The head dims the e4m3 kernels were built for, in head_dims' sense; empty: those of
  // head_dims.
  std::vector<int> fp8_head_dims;
  bool supports_fp8_varlen = false;   // e4m3 inputs in a varlen call too
  // e4m3 v is read by TMA (its base and strides 16-byte multiples), not element-wise by
  // a transpose into the workspace: FP8 kernels that transpose V in shared memory.
  bool fp8_v_by_tma = false;
  bool supports_fp8_kvcache = false;  // e4m3 inputs in forward_with_kvcache
  // Device only: returns an empty string when `ptr` is memory the current device can
  // use, else a description of what it is ("host memory", "memory of device 1").
  // Left empty, pointer location is not checked (unit tests of the other rules).
  std::function<std::string(const void* ptr)> locate;
  // Device forward only: the workspace bytes a call needs (ForwardArgs::workspace).
  // Left empty, the workspace is not checked (the size query, the CPU path).
  std::function<std::size_t(const Problem& problem, DType dtype)> forward_workspace;
  // Device backward only: the workspace bytes a call needs (BackwardArgs::workspace).
  // Left empty, the workspace is not checked (the size query, the CPU path).
  std::function<std::size_t(const Problem& problem, bool deterministic)> backward_workspace;
  // Device only: whether forward_with_kvcache runs here; and the workspace bytes a call
  // needs (KvCacheArgs::workspace), or kNotSupported where no kernel takes the call. Left
  // empty, the workspace is not checked (the size query).
  bool supports_kvcache = false;
  std::function<Status(const KvCacheProblem& problem, DType dtype, int num_splits, std::size_t* bytes)>
      kvcache_workspace;
  // merge_attention_states only: the most parts one call takes; 0: any number.
  std::size_t max_merge_parts = 0;
};

// "" when ptr is device (or managed) memory usable by the current device, else where it
// is ("host memory", "memory of CUDA device 1 (current device is 0)", ...): the GPU
// targets' `locate`.
std::string locate_device_pointer(const void* ptr);

// The caller's scratch memory of a device call (BackwardArgs::workspace,
// KvCacheArgs::workspace): `needed` bytes, 256-byte aligned, on the current device.
Status check_caller_workspace(const void* workspace, std::size_t bytes, std::size_t needed, const char* size_query,
                              const ValidationTarget& target);

// The target of fa3::forward: the compiled kernels, on the current device.
ValidationTarget gpu_target();
// The target of fa3::forward_with_kvcache: gpu_target with the dtypes and head dims of
// the compiled KV-cache kernels, which a build may have without any forward kernel.
ValidationTarget gpu_kvcache_target();
// gpu_target's rules on shapes, dtypes and options only: where pointers live and the
// workspace are not checked. For the queries asked before the buffers exist (the
// workspace size, the tuning class).
ValidationTarget gpu_shape_target();
// The target of fa3::backward: the compiled backward kernels and their workspace.
ValidationTarget gpu_backward_target();
// The target of fa3::cpu::forward/backward.
ValidationTarget cpu_target();
// The target of the GPU merge and combine (fa3/merge.h, fa3/kvcache.h): device memory of
// the current device, and the merge kernel's limit on parts.
ValidationTarget gpu_merge_target();

Status validate_forward(const ForwardArgs& args, const ValidationTarget& target, Problem* problem);
Status validate_backward(const BackwardArgs& args, const ValidationTarget& target, Problem* problem);

}  // namespace fa3
