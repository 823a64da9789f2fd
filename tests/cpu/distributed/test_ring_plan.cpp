// The ring's host-side plan (src/distributed/ring_plan.h): which shard each step holds
// and where, what a zigzag query shard sees of it (against the causal mask on whole-
// sequence positions), the workspace layout and the rules of a call.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "distributed/ring_plan.h"

namespace fa3::distributed::detail {
namespace {

TEST(RingZigzagChunks, EveryChunkBelongsToOneRank) {
  for (int world = 1; world <= 6; ++world) {
    std::multiset<int> chunks;
    for (int rank = 0; rank < world; ++rank) {
      const ZigzagChunks c = zigzag_chunks(rank, world);
      EXPECT_EQ(c.first, rank);
      EXPECT_EQ(c.second, 2 * world - 1 - rank);
      chunks.insert(c.first);
      chunks.insert(c.second);
    }
    std::multiset<int> all;
    for (int i = 0; i < 2 * world; ++i) all.insert(i);
    EXPECT_EQ(chunks, all) << "world " << world;
  }
}

TEST(RingSource, OwnShardFirstThenPredecessors) {
  EXPECT_EQ(ring_source(2, 0, 4), 2);
  EXPECT_EQ(ring_source(2, 1, 4), 1);
  EXPECT_EQ(ring_source(2, 2, 4), 0);
  EXPECT_EQ(ring_source(2, 3, 4), 3);
  EXPECT_EQ(ring_source(0, 1, 3), 2);
}

// Whole-sequence positions of a rank's shard (zigzag when causal), chunks of c.
std::vector<int> positions(int rank, int world, int c, bool causal) {
  std::vector<int> p;
  const std::vector<int> chunks = causal ? std::vector<int>{zigzag_chunks(rank, world).first,
                                                            zigzag_chunks(rank, world).second}
                                         : std::vector<int>{2 * rank, 2 * rank + 1};
  for (int chunk : chunks) {
    for (int i = 0; i < c; ++i) p.push_back(chunk * c + i);
  }
  return p;
}

// Index range of `half` in a shard of n positions.
std::pair<int, int> range_of(Half half, int n) {
  if (half == Half::kWhole) return {0, n};
  return half == Half::kFirst ? std::pair{0, n / 2} : std::pair{n / 2, n};
}

// The (query position, key position) pairs a step's block computes: its parts of the
// shards, under its own mask aligned to the bottom-right corner.
std::set<std::pair<int, int>> block_pairs(const BlockView& b, const std::vector<int>& q, const std::vector<int>& k) {
  std::set<std::pair<int, int>> pairs;
  const auto [q0, q1] = range_of(b.q_half, static_cast<int>(q.size()));
  const auto [k0, k1] = range_of(b.kv_half, static_cast<int>(k.size()));
  const int nq = q1 - q0, nk = k1 - k0;
  for (int i = 0; i < nq; ++i) {
    for (int j = 0; j < nk; ++j) {
      if (!b.causal || j <= i + nk - nq) pairs.insert({q[q0 + i], k[k0 + j]});
    }
  }
  return pairs;
}

TEST(RingVisibleBlock, CoversExactlyTheCausalPairsOfEachShardPair) {
  const int c = 3;
  for (int world = 1; world <= 5; ++world) {
    for (int rank = 0; rank < world; ++rank) {
      std::set<std::pair<int, int>> seen;
      for (int step = 0; step < world; ++step) {
        const int source = ring_source(rank, step, world);
        const auto q = positions(rank, world, c, true);
        const auto k = positions(source, world, c, true);
        std::set<std::pair<int, int>> expected;
        for (int i : q) {
          for (int j : k) {
            if (j <= i) expected.insert({i, j});
          }
        }
        const BlockView block = visible_block(rank, source, true);
        const auto got = block_pairs(block, q, k);
        EXPECT_EQ(got, expected) << "world " << world << " rank " << rank << " source " << source;
        EXPECT_FALSE(expected.empty()) << "zigzag gives every step some work";
        seen.insert(got.begin(), got.end());
      }
      // Over the ring, each query sees every earlier key once.
      std::size_t total = 0;
      for (int i : positions(rank, world, c, true)) total += static_cast<std::size_t>(i) + 1;
      EXPECT_EQ(seen.size(), total);
    }
  }
}

TEST(RingVisibleBlock, WithoutCausalEveryBlockIsWhole) {
  for (int source = 0; source < 4; ++source) {
    const BlockView b = visible_block(1, source, false);
    EXPECT_EQ(b.q_half, Half::kWhole);
    EXPECT_EQ(b.kv_half, Half::kWhole);
    EXPECT_FALSE(b.causal);
  }
}

TEST(RingVisibleBlock, ZigzagCases) {
  const BlockView own = visible_block(2, 2, true);
  EXPECT_TRUE(own.causal);
  EXPECT_EQ(own.q_half, Half::kWhole);
  const BlockView earlier = visible_block(2, 0, true);
  EXPECT_EQ(earlier.q_half, Half::kWhole);
  EXPECT_EQ(earlier.kv_half, Half::kFirst);
  EXPECT_FALSE(earlier.causal);
  const BlockView later = visible_block(2, 3, true);
  EXPECT_EQ(later.q_half, Half::kSecond);
  EXPECT_EQ(later.kv_half, Half::kWhole);
  EXPECT_FALSE(later.causal);
}

TEST(RingSchedule, TwoReceiveBuffersAlternateAndNeverHoldTheShardInHand) {
  for (int world = 1; world <= 6; ++world) {
    const auto steps = ring_schedule(1 % world, world, true);
    ASSERT_EQ(static_cast<int>(steps.size()), world);
    EXPECT_EQ(steps[0].hand, -1);
    EXPECT_EQ(steps[0].source, 1 % world);
    EXPECT_EQ(steps.back().receive, -1);
    for (int s = 0; s < world; ++s) {
      EXPECT_EQ(steps[s].source, ring_source(1 % world, s, world));
      if (s > 0) EXPECT_EQ(steps[s].hand, steps[s - 1].receive) << "step " << s << " computes what arrived";
      if (s + 1 < world) {
        EXPECT_TRUE(steps[s].receive == 0 || steps[s].receive == 1);
        EXPECT_NE(steps[s].receive, steps[s].hand);
      }
    }
  }
}

// Fake, aligned addresses: validation and the layout read no tensor data.
void* at(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

RingArgs valid_args(std::int64_t shard = 6) {
  RingArgs a;
  a.q = TensorView::contiguous(at(0x100000), DType::kBFloat16, {2, shard, 4, 64});
  a.k = TensorView::contiguous(at(0x200000), DType::kBFloat16, {2, shard, 2, 64});
  a.v = TensorView::contiguous(at(0x300000), DType::kBFloat16, {2, shard, 2, 64});
  a.out = TensorView::contiguous(at(0x400000), DType::kBFloat16, {2, shard, 4, 64});
  a.lse = TensorView::contiguous(at(0x500000), DType::kFloat32, {2, 4, shard});
  a.causal = true;
  a.workspace = at(0x1000000);
  a.workspace_bytes = 1 << 20;
  return a;
}

ValidationTarget device_target() {
  ValidationTarget t;
  t.dtypes = {DType::kFloat16, DType::kBFloat16};
  t.head_dims = {64, 128};
  return t;
}

TEST(RingWorkspaceLayout, OneRankNeedsNone) { EXPECT_EQ(workspace_layout(valid_args(), 1).bytes, 0u); }

TEST(RingWorkspaceLayout, TwoReceiveBuffersAndFp32RunningResult) {
  const WorkspaceLayout l = workspace_layout(valid_args(), 4);
  EXPECT_EQ(l.k_bytes, 2u * 6 * 2 * 64 * 2);  // 3072
  EXPECT_EQ(l.v_bytes, 3072u);
  EXPECT_EQ(l.receive[0], 0u);
  EXPECT_EQ(l.receive[1], 6144u);
  EXPECT_EQ(l.acc_out, 12288u);
  EXPECT_EQ(l.acc_lse, 12288u + 2 * 6 * 4 * 64 * 4);                 // + 12288
  EXPECT_EQ(l.block_out, l.acc_lse + 256);                            // 192 bytes of lse, aligned up
  EXPECT_EQ(l.block_lse, l.block_out + 2 * 6 * 4 * 64 * 2);           // + 6144
  EXPECT_EQ(l.bytes, l.block_lse + 256);
  for (std::size_t offset : {l.receive[1], l.acc_out, l.acc_lse, l.block_out, l.block_lse, l.bytes}) {
    EXPECT_EQ(offset % 256, 0u);
  }
}

TEST(RingWorkspaceLayout, VsHeadDimSizesTheOutputs) {
  RingArgs a = valid_args();
  a.v = TensorView::contiguous(at(0x300000), DType::kBFloat16, {2, 6, 2, 32});
  const WorkspaceLayout l = workspace_layout(a, 2);
  EXPECT_EQ(l.v_bytes, 2u * 6 * 2 * 32 * 2);
  EXPECT_EQ(l.acc_lse - l.acc_out, 2u * 6 * 4 * 32 * 4);
}

Status validate(const RingArgs& a, int rank = 1, int world = 4, bool check_workspace = true) {
  return validate_ring(a, rank, world, device_target(), check_workspace);
}

void expect_invalid(const Status& s, const std::string& message) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
}

TEST(RingValidate, AcceptsAValidShard) {
  EXPECT_TRUE(validate(valid_args()).is_ok()) << validate(valid_args()).to_string();
  RingArgs plain = valid_args(7);
  plain.causal = false;
  plain.lse = {};
  EXPECT_TRUE(validate(plain).is_ok()) << validate(plain).to_string();
}

// sm_margin is the blocks' (AttentionOptions'), with its rule.
TEST(RingValidate, SmMarginReachesTheCallsAndIsChecked) {
  RingArgs a = valid_args();
  a.sm_margin = 8;
  EXPECT_TRUE(validate(a).is_ok()) << validate(a).to_string();
  EXPECT_EQ(shard_forward_args(a).options.sm_margin, 8);
  a.sm_margin = -1;
  expect_invalid(validate(a), "sm_margin must be >= 0 (SMs left free), got -1");
}

TEST(RingValidate, RankOutsideTheWorld) {
  expect_invalid(validate(valid_args(), 4, 4), "comm: rank 4 of 4 ranks; need 0 <= rank < world size");
  expect_invalid(validate(valid_args(), 0, 0), "comm: rank 0 of 0 ranks");
}

TEST(RingValidate, MissingOrWrongRankTensors) {
  RingArgs a = valid_args();
  a.k.data = nullptr;
  expect_invalid(validate(a), "k: required, got a null pointer");
  a = valid_args();
  a.out = TensorView::contiguous(at(0x400000), DType::kBFloat16, {12, 4, 64});
  expect_invalid(validate(a), "out: expected a 4-d shard (batch, shard_len, nheads, head_dim), got rank 3");
}

TEST(RingValidate, ShardsOfOnePositions) {
  RingArgs a = valid_args();
  a.v = TensorView::contiguous(at(0x300000), DType::kBFloat16, {2, 8, 2, 64});
  expect_invalid(validate(a), "v: every rank holds the same positions of q, k and v; the shard has 6 queries and 8 keys");
}

TEST(RingValidate, CausalShardsSplitInTwo) {
  expect_invalid(validate(valid_args(7)),
                 "q: causal ring attention takes zigzag shards of two equal chunks; a shard of 7 positions");
}

TEST(RingValidate, TravellingShardsAreContiguous) {
  RingArgs a = valid_args();
  a.k = TensorView::strided(at(0x200000), DType::kBFloat16, {2, 6, 2, 64}, {6 * 4 * 64, 4 * 64, 64, 1});
  expect_invalid(validate(a), "k: must be contiguous, as its shard travels whole between ranks");
  // One rank sends nothing: any strides fa3::forward takes.
  EXPECT_TRUE(validate(a, 0, 1).is_ok()) << validate(a, 0, 1).to_string();
}

TEST(RingValidate, ForwardsRulesApplyToTheWholeShard) {
  RingArgs a = valid_args();
  a.out.dtype = DType::kFloat16;
  EXPECT_EQ(validate(a).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(validate(a).message().find("out"), std::string::npos) << validate(a).message();
  a = valid_args();
  a.q = TensorView::contiguous(at(0x100000), DType::kBFloat16, {2, 6, 4, 72});
  a.k = TensorView::contiguous(at(0x200000), DType::kBFloat16, {2, 6, 2, 72});
  EXPECT_FALSE(validate(a).is_ok());
}

TEST(RingValidate, WorkspaceLargeEnoughAndAligned) {
  RingArgs a = valid_args();
  const std::size_t need = workspace_layout(a, 4).bytes;
  a.workspace_bytes = need - 1;
  expect_invalid(validate(a), "workspace: the ring of 4 ranks needs " + std::to_string(need) +
                                  " bytes (ring_workspace_size), got " + std::to_string(need - 1));
  a.workspace = nullptr;
  expect_invalid(validate(a), "and a null pointer");
  a = valid_args();
  a.workspace = at(0x1000080);
  expect_invalid(validate(a), "workspace: must be 256-byte aligned");
  // The size query checks everything else.
  a.workspace = nullptr;
  a.workspace_bytes = 0;
  EXPECT_TRUE(validate(a, 1, 4, false).is_ok());
  EXPECT_TRUE(validate(a, 0, 1).is_ok()) << "one rank needs no workspace";
}

// A target that finds every pointer on the current device but `away`.
ValidationTarget locating_target(const void* away) {
  ValidationTarget t = device_target();
  t.locate = [away](const void* p) { return p == away ? std::string("host memory") : std::string(); };
  return t;
}

TEST(RingValidate, WorkspaceOnTheCurrentDevice) {
  const RingArgs a = valid_args();
  expect_invalid(validate_ring(a, 1, 4, locating_target(a.workspace), true),
                 "workspace: pointer is host memory, not memory of the current CUDA device");
  EXPECT_TRUE(validate_ring(a, 1, 4, locating_target(nullptr), true).is_ok());
}

TEST(RingSequencePart, HalvesAreViewsOfTheSameMemory) {
  const TensorView q = TensorView::contiguous(at(0x100000), DType::kBFloat16, {2, 6, 4, 64});
  const TensorView first = sequence_part(q, 1, Half::kFirst);
  const TensorView second = sequence_part(q, 1, Half::kSecond);
  EXPECT_EQ(first.data, q.data);
  EXPECT_EQ(first.shape[1], 3);
  EXPECT_EQ(second.shape[1], 3);
  EXPECT_EQ(static_cast<char*>(second.data) - static_cast<char*>(q.data), 3 * 4 * 64 * 2);
  EXPECT_EQ(second.stride[0], q.stride[0]);
  const TensorView lse = TensorView::contiguous(at(0x500000), DType::kFloat32, {2, 4, 6});
  const TensorView lse_second = sequence_part(lse, 2, Half::kSecond);
  EXPECT_EQ(static_cast<char*>(lse_second.data) - static_cast<char*>(lse.data), 3 * 4);
  EXPECT_EQ(lse_second.shape[2], 3);
  EXPECT_EQ(sequence_part(q, 1, Half::kWhole).data, q.data);
}

TEST(RingKvShard, CallersAtFirstThenReceiveBuffersOfKThenV) {
  const RingArgs a = valid_args();
  const std::size_t receive[2] = {0, 8192};
  const KvShard own = kv_shard(a.k, a.v, at(0x1000000), receive, -1);
  EXPECT_EQ(own.k.data, a.k.data);
  EXPECT_EQ(own.v.data, a.v.data);
  const KvShard second = kv_shard(a.k, a.v, at(0x1000000), receive, 1);
  EXPECT_EQ(second.k.data, at(0x1000000 + 8192));
  EXPECT_EQ(second.v.data, at(0x1000000 + 8192 + 2 * 6 * 2 * 64 * 2));
  for (const TensorView* t : {&second.k, &second.v}) {
    EXPECT_EQ(t->dtype, DType::kBFloat16);
    EXPECT_EQ(t->shape[1], 6);
    EXPECT_EQ(t->stride[0], 6 * 2 * 64);
    EXPECT_EQ(t->stride[3], 1);
  }
}

}  // namespace
}  // namespace fa3::distributed::detail
