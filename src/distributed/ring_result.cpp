#include "distributed/ring_result.h"

#include "fa3/merge.h"

namespace fa3::distributed::detail {

RunningResult running_result(const RingArgs& args, const WorkspaceLayout& layout) {
  char* ws = static_cast<char*>(args.workspace);
  const std::int64_t batch = args.q.shape[0], shard_len = args.q.shape[1], nheads = args.q.shape[2];
  return {TensorView::contiguous(ws + layout.acc_out, DType::kFloat32, {batch, shard_len, nheads, args.v.shape[3]}),
          TensorView::contiguous(ws + layout.acc_lse, DType::kFloat32, {batch, nheads, shard_len})};
}

Status merge_block(const RunningResult& running, const TensorView& block_out, const TensorView& block_lse, Half q_half,
                   bool first, cudaStream_t stream) {
  // The block's rows of the running result are part 0 and the result: merge.h lets out
  // and lse be a part's storage.
  const TensorView rows_out = sequence_part(running.out, 1, q_half);
  const TensorView rows_lse = sequence_part(running.lse, 2, q_half);
  MergeArgs merge;
  if (!first) {
    merge.outs.push_back(rows_out);
    merge.lses.push_back(rows_lse);
  }
  merge.outs.push_back(block_out);
  merge.lses.push_back(block_lse);
  merge.out = rows_out;
  merge.lse = rows_lse;
  return merge_attention_states(merge, stream);
}

Status write_result(const RunningResult& running, const TensorView& out, const TensorView& lse, cudaStream_t stream) {
  MergeArgs merge;
  merge.outs = {running.out};
  merge.lses = {running.lse};
  merge.out = out;
  // The merge always writes an lse: without the caller's, the running one takes its own
  // values back (a 1-part merge's lse is its part's).
  merge.lse = lse.defined() ? lse : running.lse;
  return merge_attention_states(merge, stream);
}

}  // namespace fa3::distributed::detail
