#include "hopper/merge.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "hopper/launch_util.h"
#include "hopper/merge_kernel.cuh"
#include "hopper/merge_params.h"

namespace fa3::hopper {
namespace {

constexpr int kVectorBytes = 16;
// The common call merges two parts (ring attention's steps): its parameters stay small.
constexpr int kFewParts = 16;

// A tensor's rows in (batch, seqlen, head) order, whatever order its dimensions are in.
RowTensor rows_of(const TensorView& t, int batch_dim, int seq_dim, int head_dim, int value_dim) {
  RowTensor r;
  r.data = t.data;
  r.stride[0] = batch_dim < 0 ? 0 : t.stride[batch_dim];
  r.stride[1] = t.stride[seq_dim];
  r.stride[2] = t.stride[head_dim];
  r.stride_d = t.stride[value_dim];
  return r;
}

RowScalars scalars_of(const TensorView& t, int batch_dim, int seq_dim, int head_dim) {
  RowScalars r;
  r.data = static_cast<const float*>(t.data);
  r.stride[0] = batch_dim < 0 ? 0 : t.stride[batch_dim];
  r.stride[1] = t.stride[seq_dim];
  r.stride[2] = t.stride[head_dim];
  return r;
}

// Whether `t` allows accesses of `vec` values of `bytes` each at every lane's position:
// contiguous values, an aligned start, and row strides that keep it aligned. A stride
// of a dimension of extent 1 is never used, whatever it is.
bool vector_ready(const RowTensor& t, const MergeShape& shape, int vec, std::size_t bytes) {
  if (t.stride_d != 1 || shape.head_dim % vec != 0) return false;
  if (reinterpret_cast<std::uintptr_t>(t.data) % (vec * bytes) != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (shape.extent[i] > 1 && t.stride[i] % vec != 0) return false;
  }
  return true;
}

MergeShape shape_of(std::int64_t batch, std::int64_t seqlen, std::int64_t heads, std::int64_t head_dim, int vec) {
  MergeShape s;
  s.extent[0] = batch;
  s.extent[1] = seqlen;
  s.extent[2] = heads;
  s.rows = batch * seqlen * heads;
  s.head_dim = head_dim;
  // The fewest lanes (a power of two, up to a warp) that cover the row in one vector
  // each: a head dim of 128 in bf16 takes 16 lanes, in fp32 32.
  int lanes = 1;
  while (lanes < 32 && static_cast<std::int64_t>(lanes) * vec < head_dim) lanes *= 2;
  s.lanes_per_row = lanes;
  return s;
}

template <class Parts, class Out, int kVec>
Status launch(const MergeParams<Parts>& p, cudaStream_t stream) {
  const std::int64_t rows_per_block = kMergeThreads / p.shape.lanes_per_row;
  const std::int64_t blocks = (p.shape.rows + rows_per_block - 1) / rows_per_block;
  if (blocks > std::numeric_limits<int>::max()) {
    return {StatusCode::kNotSupported,
            "out: " + std::to_string(p.shape.rows) + " rows are more than one merge launch covers"};
  }
  // A programmatic dependent of the kernel before it in the stream (the KV-cache
  // kernel's splits lets it launch early): the merge waits for that kernel's completion
  // before its first read (merge_kernel), so only the launch overlaps.
  return detail::cuda_status(detail::launch_kernel(merge_kernel<Parts, Out, kVec>, dim3(static_cast<unsigned>(blocks)),
                                                   dim3(kMergeThreads), 0, stream, true, p),
                             "merge kernel launch");
}

std::size_t bytes_of(PartType t) { return t == PartType::kFloat32 ? sizeof(float) : 2; }

// Picks 16-byte accesses of the call's widest type when every part and the result allow
// them (8 values in an all-16-bit call, else 4), otherwise one value each.
template <class Parts, class Out>
Status launch_aligned(MergeParams<Parts>& p, cudaStream_t stream) {
  std::size_t widest = sizeof(Out);
  for (int i = 0; i < p.parts.count; ++i) widest = std::max(widest, bytes_of(p.parts.get(i).type));
  const int vec = static_cast<int>(kVectorBytes / widest);
  bool vectors = vector_ready(p.out, p.shape, vec, sizeof(Out));
  for (int i = 0; i < p.parts.count && vectors; ++i) {
    const MergePart part = p.parts.get(i);
    vectors = vector_ready(part.out, p.shape, vec, bytes_of(part.type));
  }
  // The lanes per row follow from the access width chosen.
  p.shape = shape_of(p.shape.extent[0], p.shape.extent[1], p.shape.extent[2], p.shape.head_dim, vectors ? vec : 1);
  if (p.shape.rows == 0) return Status::ok();
  if (!vectors) return launch<Parts, Out, 1>(p, stream);
  if constexpr (sizeof(Out) == 2) {
    if (vec == 8) return launch<Parts, Out, 8>(p, stream);
  }
  return launch<Parts, Out, 4>(p, stream);
}

PartType part_type(DType dtype) {
  if (dtype == DType::kFloat16) return PartType::kFloat16;
  if (dtype == DType::kBFloat16) return PartType::kBFloat16;
  return PartType::kFloat32;
}

// merge_attention_states' parts and result in a parameter block of capacity kCapacity.
template <int kCapacity, class Out>
Status merge_listed(const MergeArgs& args, cudaStream_t stream) {
  MergeParams<ListedParts<kCapacity>> p;
  const TensorView& o = args.out;
  p.shape = shape_of(o.shape[0], o.shape[1], o.shape[2], o.shape[3], 1);
  p.parts.count = static_cast<int>(args.outs.size());
  for (std::size_t i = 0; i < args.outs.size(); ++i) {
    // outs (batch, seqlen, nheads, head_dim); lses (batch, nheads, seqlen).
    p.parts.part[i].out = rows_of(args.outs[i], 0, 1, 2, 3);
    p.parts.part[i].lse = scalars_of(args.lses[i], 0, 2, 1);
    p.parts.part[i].type = part_type(args.outs[i].dtype);
  }
  p.out = rows_of(args.out, 0, 1, 2, 3);
  p.lse = scalars_of(args.lse, 0, 2, 1);
  return launch_aligned<ListedParts<kCapacity>, Out>(p, stream);
}

template <class T>
Status merge_typed(const MergeArgs& args, cudaStream_t stream) {
  // Validation refuses more; the parameter block has no room for them.
  if (args.outs.size() > kMaxMergeParts) {
    return {StatusCode::kInternal, "merge: more parts than the kernel's parameters hold reached the launch"};
  }
  if (args.outs.size() <= kFewParts) return merge_listed<kFewParts, T>(args, stream);
  return merge_listed<static_cast<int>(kMaxMergeParts), T>(args, stream);
}

template <class Out>
Status combine_typed(const CombineProblem& pr, const CombineArgs& args, cudaStream_t stream) {
  MergeParams<SlicedParts> p;
  p.shape = shape_of(1, pr.rows, pr.nheads, pr.head_dim, 1);
  p.parts.count = static_cast<int>(pr.num_splits);
  // out_partial (num_splits, rows, nheads, head_dim), lse_partial (num_splits, rows,
  // nheads): split 0's rows, then a step per split. Rows are batch 1's positions.
  p.parts.first.out = rows_of(args.out_partial, -1, 1, 2, 3);
  p.parts.first.lse = scalars_of(args.lse_partial, -1, 1, 2);
  p.parts.out_step = args.out_partial.stride[0];
  p.parts.lse_step = args.lse_partial.stride[0];
  p.out = rows_of(args.out, -1, 0, 1, 2);
  if (args.lse.defined()) p.lse = scalars_of(args.lse, -1, 0, 1);
  return launch_aligned<SlicedParts, Out>(p, stream);
}

template <class Out>
Status split_merge_typed(const float* out_partial, const float* lse_partial, int num_splits, const TensorView& out,
                         const TensorView& lse, cudaStream_t stream) {
  const std::int64_t batch = out.shape[0], seqlen = out.shape[1], heads = out.shape[2], head_dim = out.shape[3];
  MergeParams<SlicedParts> p;
  p.shape = shape_of(batch, seqlen, heads, head_dim, 1);
  p.parts.count = num_splits;
  p.parts.first.out.data = out_partial;
  p.parts.first.out.stride[0] = seqlen * heads * head_dim;
  p.parts.first.out.stride[1] = heads * head_dim;
  p.parts.first.out.stride[2] = head_dim;
  p.parts.first.lse.data = lse_partial;
  p.parts.first.lse.stride[0] = seqlen * heads;
  p.parts.first.lse.stride[1] = heads;
  p.parts.first.lse.stride[2] = 1;
  p.parts.out_step = batch * seqlen * heads * head_dim;
  p.parts.lse_step = batch * seqlen * heads;
  p.out = rows_of(out, 0, 1, 2, 3);
  if (lse.defined()) p.lse = scalars_of(lse, 0, 2, 1);
  return launch_aligned<SlicedParts, Out>(p, stream);
}

}  // namespace

Status launch_split_merge(const float* out_partial, const float* lse_partial, int num_splits, const TensorView& out,
                          const TensorView& lse, cudaStream_t stream) {
  switch (out.dtype) {
    case DType::kFloat16:
      return split_merge_typed<__half>(out_partial, lse_partial, num_splits, out, lse, stream);
    case DType::kBFloat16:
      return split_merge_typed<__nv_bfloat16>(out_partial, lse_partial, num_splits, out, lse, stream);
    default:
      return {StatusCode::kInternal, "KV-cache merge: out's dtype passed validation but has no kernel"};
  }
}

Status launch_merge(const MergeArgs& args, cudaStream_t stream) {
  switch (args.out.dtype) {
    case DType::kFloat32:
      return merge_typed<float>(args, stream);
    case DType::kFloat16:
      return merge_typed<__half>(args, stream);
    case DType::kBFloat16:
      return merge_typed<__nv_bfloat16>(args, stream);
    default:
      return {StatusCode::kInternal, "merge: out's dtype passed validation but has no kernel"};
  }
}

Status launch_combine(const CombineProblem& problem, const CombineArgs& args, cudaStream_t stream) {
  if (problem.num_splits > std::numeric_limits<int>::max()) {
    return {StatusCode::kNotSupported,
            "out_partial: num_splits " + std::to_string(problem.num_splits) + " is more than one combine launch takes"};
  }
  switch (args.out.dtype) {
    case DType::kFloat32:
      return combine_typed<float>(problem, args, stream);
    case DType::kFloat16:
      return combine_typed<__half>(problem, args, stream);
    case DType::kBFloat16:
      return combine_typed<__nv_bfloat16>(problem, args, stream);
    default:
      return {StatusCode::kInternal, "combine: out's dtype passed validation but has no kernel"};
  }
}

}  // namespace fa3::hopper
