// fa3 — the host-side plan of ring attention (fa3/distributed.h): which K/V shard each
// step holds, what part of it a zigzag query shard sees, the workspace's layout and the
// rules a call must follow. No NCCL and no device work here, so all of it is tested on
// the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "api/validate.h"
#include "fa3/distributed.h"

namespace fa3::distributed::detail {

// The chunks of the 2W-chunk sequence that rank holds under zigzag sharding.
struct ZigzagChunks {
  int first;   // rank
  int second;  // 2W - 1 - rank
};
ZigzagChunks zigzag_chunks(int rank, int world_size);

// The rank whose K/V shard `rank` holds at `step`: its own at step 0, then its
// predecessor's, and so on around the ring ((rank - step) mod W).
int ring_source(int rank, int step, int world_size);

// A part of a shard along the sequence: the whole of it, or one of its two zigzag chunks.
enum class Half : std::int8_t { kWhole = -1, kFirst = 0, kSecond = 1 };

// What the query shard of one rank sees of the K/V shard of another. With zigzag
// shards every pair sees something: the own shard causally; an earlier rank's shard
// (source < rank) through its first chunk, with every query (both of rank's chunks
// come after chunk source and before 2W - 1 - source); a later rank's shard with the
// second query chunk only (2W - 1 - rank comes after both of source's chunks), in full.
struct BlockView {
  Half q_half = Half::kWhole;
  Half kv_half = Half::kWhole;
  bool causal = false;  // the block's own mask (the diagonal block only)
};
BlockView visible_block(int rank, int source, bool causal);

// One step of the ring on one rank: the K/V shard in hand and where it is, and the
// buffer the next shard arrives in.
struct RingStep {
  int source;       // whose K/V shard is in hand
  BlockView block;  // what of it the query shard sees
  int hand;         // where it is: -1 the caller's k and v, else receive buffer 0 or 1
  int receive;      // the receive buffer the next shard arrives in; -1 on the last step
};
std::vector<RingStep> ring_schedule(int rank, int world_size, bool causal);

// The bytes of a tensor's elements (of a contiguous tensor: its memory).
std::size_t bytes_of(const TensorView& t);

// Regions of a workspace, one after another, each starting 256-byte aligned (as the
// caller's workspace does): take() gives a region's offset, end() the bytes so far.
constexpr std::size_t kWorkspaceAlign = 256;
class WorkspaceCarver {
 public:
  std::size_t take(std::size_t bytes);
  std::size_t end() const { return at_; }

 private:
  std::size_t at_ = 0;
};

// Byte offsets into the workspace, each 256-byte aligned. A receive buffer holds one
// K shard followed by one V shard.
struct WorkspaceLayout {
  std::size_t k_bytes = 0, v_bytes = 0;  // one shard of each, as sent
  std::size_t receive[2] = {0, 0};
  std::size_t acc_out = 0;    // fp32 (batch, shard_len, nheads_q, head_dim_v)
  std::size_t acc_lse = 0;    // fp32 (batch, nheads_q, shard_len)
  std::size_t block_out = 0;  // q's dtype, acc_out's shape
  std::size_t block_lse = 0;  // fp32, acc_lse's shape
  std::size_t bytes = 0;      // the whole workspace (0 for one rank)
};
// Assumes args passed validate_ring's shape rules.
WorkspaceLayout workspace_layout(const RingArgs& args, int world_size);

// The local call on the whole shard (q against the rank's whole K/V shard): what every
// block of the ring is a part of, and the one call a ring of one rank makes.
ForwardArgs shard_forward_args(const RingArgs& args);

// The rules both directions share, on the shards alone: `rank` within the world; q, k,
// v and the `outputs` given, 4-d; k and v of q's positions; halves of zigzag shards
// when causal; k and v contiguous when they travel (more than one rank).
using NamedShards = std::initializer_list<std::pair<const char*, const TensorView*>>;
Status validate_shards(const TensorView& q, const TensorView& k, const TensorView& v, const NamedShards& outputs,
                       bool causal, int rank, int world_size);

// The caller's workspace of a ring call: at least `need` bytes, 256-byte aligned, and
// memory of the current device where `target` locates pointers. `size_query` names the
// function that gives `need`.
Status check_ring_workspace(const void* workspace, std::size_t bytes, std::size_t need, int world_size,
                            const char* size_query, const ValidationTarget& target);

// The rules of ring_forward for `rank` of `world_size`, against `target` (fa3::forward's
// on the device; a target without pointer checks in tests). check_workspace: whether
// the workspace is checked (not for the size query).
Status validate_ring(const RingArgs& args, int rank, int world_size, const ValidationTarget& target,
                     bool check_workspace);

// `t`'s part `half` along dimension `dim` (the sequence), as a view of the same memory.
TensorView sequence_part(const TensorView& t, int dim, Half half);

// A contiguous view at `data` of `t`'s first three dimensions and a last one of `last`.
TensorView contiguous_like(void* data, DType dtype, const TensorView& t, std::int64_t last);

// The K/V shard in hand at a step: the caller's k and v (buffer -1), else receive
// buffer `buffer` of the workspace (at offset receive[buffer]: K, then V), contiguous.
struct KvShard {
  TensorView k, v;
};
KvShard kv_shard(const TensorView& k, const TensorView& v, void* workspace, const std::size_t (&receive)[2],
                 int buffer);

}  // namespace fa3::distributed::detail
