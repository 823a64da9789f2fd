#include "distributed/ring_plan.h"

#include <string>

#include "api/validate_messages.h"
#include "common/status_macros.h"
#include "fa3/attention.h"

namespace fa3::distributed::detail {
namespace {

using ::fa3::detail::cat;
using ::fa3::detail::invalid;
using ::fa3::detail::shape_string;

bool is_contiguous(const TensorView& t) {
  std::int64_t expected = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.stride[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

Status check_rank4(const char* name, const TensorView& t) {
  if (t.data == nullptr) return invalid(cat(name, ": required, got a null pointer"));
  if (t.rank != 4) {
    return invalid(cat(name, ": expected a 4-d shard (batch, shard_len, nheads, head_dim), got rank ", t.rank));
  }
  return Status::ok();
}

}  // namespace

std::size_t bytes_of(const TensorView& t) { return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype); }

std::size_t WorkspaceCarver::take(std::size_t bytes) {
  const std::size_t offset = at_;
  at_ += (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  return offset;
}

ZigzagChunks zigzag_chunks(int rank, int world_size) { return {rank, 2 * world_size - 1 - rank}; }

int ring_source(int rank, int step, int world_size) { return ((rank - step) % world_size + world_size) % world_size; }

BlockView visible_block(int rank, int source, bool causal) {
  if (!causal) return {};
  if (source == rank) return {Half::kWhole, Half::kWhole, true};
  if (source < rank) return {Half::kWhole, Half::kFirst, false};
  return {Half::kSecond, Half::kWhole, false};
}

std::vector<RingStep> ring_schedule(int rank, int world_size, bool causal) {
  std::vector<RingStep> steps;
  for (int step = 0; step < world_size; ++step) {
    const int source = ring_source(rank, step, world_size);
    // Step s computes on what arrived at step s - 1 while the next shard arrives in the
    // other buffer: two buffers alternate, the caller's k and v are the first in hand.
    const int hand = step == 0 ? -1 : (step - 1) % 2;
    const int receive = step + 1 < world_size ? step % 2 : -1;
    steps.push_back({source, visible_block(rank, source, causal), hand, receive});
  }
  return steps;
}

WorkspaceLayout workspace_layout(const RingArgs& args, int world_size) {
  WorkspaceLayout l;
  l.k_bytes = bytes_of(args.k);
  l.v_bytes = bytes_of(args.v);
  if (world_size <= 1) return l;
  const auto batch = static_cast<std::size_t>(args.q.shape[0]);
  const auto shard = static_cast<std::size_t>(args.q.shape[1]);
  const auto nheads = static_cast<std::size_t>(args.q.shape[2]);
  const auto head_dim_v = static_cast<std::size_t>(args.v.shape[3]);
  const std::size_t out_elems = batch * shard * nheads * head_dim_v;
  const std::size_t lse_elems = batch * nheads * shard;
  WorkspaceCarver carve;
  l.receive[0] = carve.take(l.k_bytes + l.v_bytes);
  l.receive[1] = carve.take(l.k_bytes + l.v_bytes);
  l.acc_out = carve.take(out_elems * sizeof(float));
  l.acc_lse = carve.take(lse_elems * sizeof(float));
  l.block_out = carve.take(out_elems * dtype_size(args.q.dtype));
  l.block_lse = carve.take(lse_elems * sizeof(float));
  l.bytes = carve.end();
  return l;
}

ForwardArgs shard_forward_args(const RingArgs& args) {
  ForwardArgs whole;
  whole.q = args.q;
  whole.k = args.k;
  whole.v = args.v;
  whole.out = args.out;
  whole.lse = args.lse;
  whole.options.softmax_scale = args.softmax_scale;
  whole.options.causal = args.causal;
  whole.options.sm_margin = args.sm_margin;
  return whole;
}

Status validate_shards(const TensorView& q, const TensorView& k, const TensorView& v, const NamedShards& outputs,
                       bool causal, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return invalid(cat("comm: rank ", rank, " of ", world_size, " ranks; need 0 <= rank < world size"));
  }
  FA3_RETURN_IF_ERROR(check_rank4("q", q));
  FA3_RETURN_IF_ERROR(check_rank4("k", k));
  FA3_RETURN_IF_ERROR(check_rank4("v", v));
  for (const auto& [name, t] : outputs) FA3_RETURN_IF_ERROR(check_rank4(name, *t));
  for (const auto& [name, t] : {std::pair{"k", &k}, std::pair{"v", &v}}) {
    if (t->shape[1] != q.shape[1]) {
      return invalid(cat(name, ": every rank holds the same positions of q, k and v; the shard has ", q.shape[1],
                         " queries and ", t->shape[1], " keys"));
    }
  }
  if (causal && q.shape[1] % 2 != 0) {
    return invalid(cat("q: causal ring attention takes zigzag shards of two equal chunks; a shard of ", q.shape[1],
                       " positions does not split in two"));
  }
  if (world_size > 1) {
    for (const auto& [name, t] : {std::pair{"k", &k}, std::pair{"v", &v}}) {
      if (!is_contiguous(*t)) {
        return invalid(cat(name, ": must be contiguous, as its shard travels whole between ranks; got shape ",
                           shape_string(*t), " with other strides"));
      }
    }
  }
  return Status::ok();
}

Status check_ring_workspace(const void* workspace, std::size_t bytes, std::size_t need, int world_size,
                            const char* size_query, const ValidationTarget& target) {
  if (workspace == nullptr || bytes < need) {
    return invalid(cat("workspace: the ring of ", world_size, world_size == 1 ? " rank" : " ranks", " needs ",
                       std::to_string(need), " bytes (", size_query, "), got ", std::to_string(bytes),
                       workspace == nullptr ? " and a null pointer" : ""));
  }
  if (reinterpret_cast<std::uintptr_t>(workspace) % kWorkspaceAlign != 0) {
    return invalid("workspace: must be 256-byte aligned");
  }
  // The ring's kernels run on it after the first transfers are enqueued: memory they
  // cannot use would fail the call half-way, with its peers waiting.
  if (target.locate) {
    const std::string where = target.locate(workspace);
    if (!where.empty()) return invalid("workspace: pointer is " + where + ", not memory of the current CUDA device");
  }
  return Status::ok();
}

Status validate_ring(const RingArgs& args, int rank, int world_size, const ValidationTarget& target,
                     bool check_workspace) {
  FA3_RETURN_IF_ERROR(
      validate_shards(args.q, args.k, args.v, {{"out", &args.out}}, args.causal, rank, world_size));
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_forward(shard_forward_args(args), target, &problem));
  if (check_workspace && world_size > 1) {
    FA3_RETURN_IF_ERROR(check_ring_workspace(args.workspace, args.workspace_bytes,
                                             workspace_layout(args, world_size).bytes, world_size,
                                             "ring_workspace_size", target));
  }
  return Status::ok();
}

TensorView sequence_part(const TensorView& t, int dim, Half half) {
  if (half == Half::kWhole) return t;
  TensorView part = t;
  part.shape[dim] = t.shape[dim] / 2;
  const std::int64_t offset = (half == Half::kSecond ? part.shape[dim] : 0) * t.stride[dim];
  part.data = static_cast<char*>(t.data) + offset * static_cast<std::int64_t>(dtype_size(t.dtype));
  return part;
}

TensorView contiguous_like(void* data, DType dtype, const TensorView& t, std::int64_t last) {
  return TensorView::contiguous(data, dtype, {t.shape[0], t.shape[1], t.shape[2], last});
}

KvShard kv_shard(const TensorView& k, const TensorView& v, void* workspace, const std::size_t (&receive)[2],
                 int buffer) {
  if (buffer < 0) return {k, v};
  char* base = static_cast<char*>(workspace) + receive[buffer];
  return {contiguous_like(base, k.dtype, k, k.shape[3]), contiguous_like(base + bytes_of(k), v.dtype, v, v.shape[3])};
}

}  // namespace fa3::distributed::detail
