// The ring backward's host-side plan (src/distributed/ring_backward_plan.h): the dk/dv
// sums' buffers along the steps (followed around a simulated ring: every rank adds into
// every shard's sums once, and they end at home), the blocks the ranks compute, the
// blocks' fa3::backward calls, the workspace layout and the rules of a call.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "distributed/ring_backward_plan.h"

namespace fa3::distributed::detail {
namespace {

TEST(RingBackwardSchedule, TheForwardsStepsWithTwoAlternatingBuffersOfSums) {
  for (bool causal : {false, true}) {
    for (int world = 1; world <= 6; ++world) {
      for (int rank = 0; rank < world; ++rank) {
        const auto steps = ring_backward_schedule(rank, world, causal);
        const auto ring = ring_schedule(rank, world, causal);
        ASSERT_EQ(steps.size(), ring.size());
        for (std::size_t s = 0; s < steps.size(); ++s) {
          EXPECT_EQ(steps[s].ring.source, ring[s].source);
          EXPECT_EQ(steps[s].ring.hand, ring[s].hand);
          EXPECT_EQ(steps[s].ring.receive, ring[s].receive);
          EXPECT_TRUE(steps[s].grads_hand == 0 || steps[s].grads_hand == 1);
          EXPECT_EQ(steps[s].grads_receive, 1 - steps[s].grads_hand);
          if (s + 1 < steps.size()) EXPECT_EQ(steps[s + 1].grads_hand, steps[s].grads_receive);
        }
        EXPECT_EQ(steps.back().grads_receive, grads_home(world)) << "the last hop brings the own sums home";
        // The first step starts the sums: its block must cover every row of q, k and v.
        EXPECT_EQ(steps[0].ring.block.q_half, Half::kWhole);
        EXPECT_EQ(steps[0].ring.block.kv_half, Half::kWhole);
      }
    }
  }
}

TEST(RingBackwardSchedule, SumsTravelWithTheirShardGetEveryRanksPartOnceAndEndAtHome) {
  for (int world = 2; world <= 6; ++world) {
    // held[r][b]: whose shard's sums rank r's buffer b holds (-1: nothing yet);
    // added[j]: the ranks whose blocks went into shard j's sums.
    std::vector<std::vector<int>> held(world, std::vector<int>(2, -1));
    std::vector<std::multiset<int>> added(world);
    std::vector<std::vector<BackwardStep>> plans;
    for (int r = 0; r < world; ++r) plans.push_back(ring_backward_schedule(r, world, true));
    for (int s = 0; s < world; ++s) {
      for (int r = 0; r < world; ++r) {
        const BackwardStep& step = plans[r][s];
        if (s == 0) {
          held[r][step.grads_hand] = r;  // the first block starts the own shard's sums
        }
        EXPECT_EQ(held[r][step.grads_hand], step.ring.source) << "world " << world << " rank " << r << " step " << s;
        added[step.ring.source].insert(r);
      }
      // The hop: each rank's sums in hand to the next rank's receive buffer.
      std::vector<std::vector<int>> next = held;
      for (int r = 0; r < world; ++r) {
        const int to = (r + 1) % world;
        next[to][plans[to][s].grads_receive] = held[r][plans[r][s].grads_hand];
      }
      held = next;
    }
    std::multiset<int> every;
    for (int r = 0; r < world; ++r) every.insert(r);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(held[r][grads_home(world)], r) << "world " << world << " rank " << r;
      EXPECT_EQ(added[r], every) << "world " << world << " shard " << r;
    }
  }
}

std::tuple<Half, Half, bool> key(const BlockView& b) { return {b.q_half, b.kv_half, b.causal}; }

TEST(RingBackwardBlockKinds, EveryBlockOfEveryRankAndNoOther) {
  for (bool causal : {false, true}) {
    for (int world = 1; world <= 6; ++world) {
      std::set<std::tuple<Half, Half, bool>> computed, kinds;
      for (int rank = 0; rank < world; ++rank) {
        for (int source = 0; source < world; ++source) computed.insert(key(visible_block(rank, source, causal)));
      }
      for (const BlockView& b : block_kinds(world, causal)) kinds.insert(key(b));
      EXPECT_EQ(kinds, computed) << "world " << world << (causal ? " causal" : "");
      EXPECT_EQ(block_kinds(world, causal).size(), kinds.size()) << "each kind once";
    }
  }
}

// Fake, aligned addresses: validation and the layout read no tensor data.
void* at(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

RingBackwardArgs valid_args(std::int64_t shard = 6) {
  RingBackwardArgs a;
  a.q = TensorView::contiguous(at(0x100000), DType::kBFloat16, {2, shard, 4, 64});
  a.k = TensorView::contiguous(at(0x200000), DType::kBFloat16, {2, shard, 2, 64});
  a.v = TensorView::contiguous(at(0x300000), DType::kBFloat16, {2, shard, 2, 64});
  a.out = TensorView::contiguous(at(0x400000), DType::kBFloat16, {2, shard, 4, 64});
  a.dout = TensorView::contiguous(at(0x500000), DType::kBFloat16, {2, shard, 4, 64});
  a.lse = TensorView::contiguous(at(0x600000), DType::kFloat32, {2, 4, shard});
  a.dq = TensorView::contiguous(at(0x700000), DType::kBFloat16, {2, shard, 4, 64});
  a.dk = TensorView::contiguous(at(0x800000), DType::kBFloat16, {2, shard, 2, 64});
  a.dv = TensorView::contiguous(at(0x900000), DType::kBFloat16, {2, shard, 2, 64});
  a.causal = true;
  a.workspace = at(0x1000000);
  a.workspace_bytes = 1 << 20;
  return a;
}

// fa3::backward's workspace in these tests: it grows with the block's queries and keys,
// and with deterministic, so that each of them shows in the result.
std::size_t fake_backward_workspace(const Problem& p, bool deterministic) {
  return static_cast<std::size_t>(1000 * p.seqlen_q + 10 * p.seqlen_k) + (deterministic ? 1 : 0);
}

ValidationTarget device_target() {
  ValidationTarget t;
  t.dtypes = {DType::kFloat16, DType::kBFloat16};
  t.head_dims = {64, 128};
  t.separate_head_dim_v = true;
  t.backward_workspace = fake_backward_workspace;
  return t;
}

TEST(RingBackwardLayout, OneRankIsTheBackwardsWorkspaceAlone) {
  const BackwardLayout l = backward_layout(valid_args(), 1, 6060);
  EXPECT_EQ(l.block_workspace, 0u);
  EXPECT_EQ(l.block_workspace_bytes, 6060u);
  EXPECT_EQ(l.bytes, 6060u);
}

TEST(RingBackwardLayout, ReceiveBuffersTravellingSumsDqSumBlockGradientsAndTheBlocksWorkspace) {
  const BackwardLayout l = backward_layout(valid_args(), 4, 1000);
  EXPECT_EQ(l.k_bytes, 2u * 6 * 2 * 64 * 2);  // 3072
  EXPECT_EQ(l.v_bytes, 3072u);
  EXPECT_EQ(l.receive[0], 0u);
  EXPECT_EQ(l.receive[1], 6144u);
  EXPECT_EQ(l.dk_sum_bytes, 2u * 6 * 2 * 64 * 4);  // 6144
  EXPECT_EQ(l.dv_sum_bytes, 6144u);
  EXPECT_EQ(l.grads_dv, 6144u);
  EXPECT_EQ(l.grads[0], 12288u);
  EXPECT_EQ(l.grads[1], 12288u + 12288);
  EXPECT_EQ(l.dq_sum, 36864u);
  EXPECT_EQ(l.block_dq, 36864u + 2 * 6 * 4 * 64 * 4);  // + 12288
  EXPECT_EQ(l.block_dk, l.block_dq + 2 * 6 * 4 * 64 * 2);  // + 6144
  EXPECT_EQ(l.block_dv, l.block_dk + 3072);
  EXPECT_EQ(l.block_workspace, l.block_dv + 3072);
  EXPECT_EQ(l.block_workspace_bytes, 1000u);
  EXPECT_EQ(l.bytes, l.block_workspace + 1024);
}

TEST(RingBackwardLayout, RegionsAreAlignedAndDisjoint) {
  RingBackwardArgs a = valid_args(10);
  a.v = TensorView::contiguous(at(0x300000), DType::kBFloat16, {2, 10, 2, 40});  // V's own head dim
  const BackwardLayout l = backward_layout(a, 3, 777);
  EXPECT_EQ(l.dv_sum_bytes, 2u * 10 * 2 * 40 * 4);
  struct Region {
    std::size_t begin, bytes;
  };
  const std::vector<Region> regions = {
      {l.receive[0], l.k_bytes + l.v_bytes}, {l.receive[1], l.k_bytes + l.v_bytes},
      {l.grads[0], l.dk_sum_bytes},          {l.grads[0] + l.grads_dv, l.dv_sum_bytes},
      {l.grads[1], l.dk_sum_bytes},          {l.grads[1] + l.grads_dv, l.dv_sum_bytes},
      {l.dq_sum, 2 * 10 * 4 * 64 * 4},       {l.block_dq, 2 * 10 * 4 * 64 * 2},
      {l.block_dk, l.k_bytes},               {l.block_dv, l.v_bytes},
      {l.block_workspace, 777}};
  for (std::size_t i = 0; i < regions.size(); ++i) {
    EXPECT_EQ(regions[i].begin % 256, 0u) << "region " << i;
    EXPECT_LE(regions[i].begin + regions[i].bytes, l.bytes) << "region " << i;
    for (std::size_t j = 0; j < i; ++j) {
      const bool apart = regions[i].begin >= regions[j].begin + regions[j].bytes ||
                         regions[j].begin >= regions[i].begin + regions[i].bytes;
      EXPECT_TRUE(apart) << "regions " << j << " and " << i;
    }
  }
}

TEST(RingBackwardArgs, TheShardsCallCarriesEveryArgument) {
  RingBackwardArgs a = valid_args();
  a.softmax_scale = 0.25f;
  a.deterministic = true;
  const BackwardArgs b = shard_backward_args(a);
  EXPECT_EQ(b.q.data, a.q.data);
  EXPECT_EQ(b.dout.data, a.dout.data);
  EXPECT_EQ(b.lse.data, a.lse.data);
  EXPECT_EQ(b.dq.data, a.dq.data);
  EXPECT_EQ(b.dv.data, a.dv.data);
  EXPECT_EQ(b.options.softmax_scale, 0.25f);
  EXPECT_TRUE(b.options.causal);
  EXPECT_TRUE(b.deterministic);
  EXPECT_EQ(b.workspace, a.workspace);
  EXPECT_EQ(b.workspace_bytes, a.workspace_bytes);
}

std::ptrdiff_t offset(const TensorView& part, const TensorView& whole) {
  return static_cast<char*>(part.data) - static_cast<char*>(whole.data);
}

TEST(RingBackwardArgs, ABlocksCallTakesItsRowsOfEveryTensorAndTheWholeRowsStatistics) {
  RingBackwardArgs a = valid_args();
  a.softmax_scale = 0.5f;
  a.deterministic = true;
  a.sm_margin = 6;
  const KvShard kv{TensorView::contiguous(at(0x2000000), DType::kBFloat16, {2, 6, 2, 64}),
                   TensorView::contiguous(at(0x3000000), DType::kBFloat16, {2, 6, 2, 64})};
  const ShardGradients grads{TensorView::contiguous(at(0x4000000), DType::kBFloat16, {2, 6, 4, 64}),
                             TensorView::contiguous(at(0x5000000), DType::kBFloat16, {2, 6, 2, 64}),
                             TensorView::contiguous(at(0x6000000), DType::kBFloat16, {2, 6, 2, 64})};
  // A later rank's shard: the second query chunk against all of it.
  const BackwardArgs later = block_backward_args(a, {Half::kSecond, Half::kWhole, false}, kv, grads);
  EXPECT_EQ(later.q.shape[1], 3);
  EXPECT_EQ(offset(later.q, a.q), 3 * 4 * 64 * 2);
  EXPECT_EQ(offset(later.out, a.out), 3 * 4 * 64 * 2);
  EXPECT_EQ(offset(later.dout, a.dout), 3 * 4 * 64 * 2);
  EXPECT_EQ(offset(later.lse, a.lse), 3 * 4);
  EXPECT_EQ(later.lse.shape[2], 3);
  EXPECT_EQ(later.lse.stride[1], 6) << "a view of the shard's lse rows";
  EXPECT_EQ(offset(later.dq, grads.dq), 3 * 4 * 64 * 2);
  EXPECT_EQ(later.k.data, kv.k.data);
  EXPECT_EQ(later.v.shape[1], 6);
  EXPECT_EQ(later.dk.data, grads.dk.data);
  EXPECT_EQ(later.dv.shape[1], 6);
  EXPECT_FALSE(later.options.causal);
  EXPECT_EQ(later.options.softmax_scale, 0.5f);
  EXPECT_EQ(later.options.sm_margin, 6) << "the SMs left to the transfers";
  EXPECT_TRUE(later.deterministic);
  EXPECT_EQ(later.workspace, nullptr) << "the caller gives the block's workspace";
  // An earlier rank's shard: every query against its first chunk.
  const BackwardArgs earlier = block_backward_args(a, {Half::kWhole, Half::kFirst, false}, kv, grads);
  EXPECT_EQ(earlier.q.data, a.q.data);
  EXPECT_EQ(earlier.q.shape[1], 6);
  EXPECT_EQ(earlier.k.data, kv.k.data);
  EXPECT_EQ(earlier.k.shape[1], 3);
  EXPECT_EQ(earlier.dk.shape[1], 3);
  EXPECT_EQ(earlier.dv.data, grads.dv.data);
  // The own shard, causally.
  const BackwardArgs own = block_backward_args(a, {Half::kWhole, Half::kWhole, true}, kv, grads);
  EXPECT_TRUE(own.options.causal);
  EXPECT_EQ(own.dq.data, grads.dq.data);
  EXPECT_EQ(own.dq.shape[1], 6);
}

TEST(RingBackwardBlockWorkspace, TheLargestOfTheBlocksCalls) {
  RingBackwardArgs a = valid_args();
  std::size_t bytes = 0;
  ASSERT_TRUE(block_workspace_bytes(a, 4, device_target(), &bytes).is_ok());
  EXPECT_EQ(bytes, 1000u * 6 + 10 * 6) << "the own shard's block: every query and key";
  a.deterministic = true;
  ASSERT_TRUE(block_workspace_bytes(a, 4, device_target(), &bytes).is_ok());
  EXPECT_EQ(bytes, 1000u * 6 + 10 * 6 + 1) << "deterministic reaches the blocks' calls";
  // A target whose workspace shrinks with more keys: then a half-key block is largest.
  ValidationTarget t = device_target();
  t.backward_workspace = [](const Problem& p, bool) { return static_cast<std::size_t>(100 * p.seqlen_q - p.seqlen_k); };
  ASSERT_TRUE(block_workspace_bytes(a, 4, t, &bytes).is_ok());
  EXPECT_EQ(bytes, 100u * 6 - 3);
  t.backward_workspace = nullptr;
  ASSERT_TRUE(block_workspace_bytes(a, 4, t, &bytes).is_ok());
  EXPECT_EQ(bytes, 0u);
}

Status validate(const RingBackwardArgs& a, int rank = 1, int world = 4, bool check_workspace = true,
                const ValidationTarget& target = device_target()) {
  BackwardLayout layout;
  return validate_ring_backward(a, rank, world, target, check_workspace, &layout);
}

void expect_invalid(const Status& s, const std::string& message) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
}

TEST(RingBackwardValidate, AcceptsAValidShardAndGivesTheLayout) {
  const RingBackwardArgs a = valid_args();
  BackwardLayout layout;
  const Status s = validate_ring_backward(a, 1, 4, device_target(), true, &layout);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(layout.bytes, backward_layout(a, 4, 1000 * 6 + 10 * 6).bytes);
  EXPECT_EQ(layout.block_workspace_bytes, 6060u);
  RingBackwardArgs plain = valid_args(7);
  plain.causal = false;
  EXPECT_TRUE(validate(plain).is_ok()) << validate(plain).to_string();
}

TEST(RingBackwardValidate, RankOutsideTheWorld) {
  expect_invalid(validate(valid_args(), 4, 4), "comm: rank 4 of 4 ranks; need 0 <= rank < world size");
}

TEST(RingBackwardValidate, MissingOrWrongRankShards) {
  RingBackwardArgs a = valid_args();
  a.dout.data = nullptr;
  expect_invalid(validate(a), "dout: required, got a null pointer");
  a = valid_args();
  a.dq.data = nullptr;
  expect_invalid(validate(a), "dq: required, got a null pointer");
  a = valid_args();
  a.dk = TensorView::contiguous(at(0x800000), DType::kBFloat16, {12, 2, 64});
  expect_invalid(validate(a), "dk: expected a 4-d shard (batch, shard_len, nheads, head_dim), got rank 3");
  a = valid_args();
  a.dv.data = nullptr;
  expect_invalid(validate(a), "dv: required, got a null pointer");
}

TEST(RingBackwardValidate, ShardsOfOnePositionsSplitInTwoWhenCausal) {
  RingBackwardArgs a = valid_args();
  a.k = TensorView::contiguous(at(0x200000), DType::kBFloat16, {2, 8, 2, 64});
  expect_invalid(validate(a), "k: every rank holds the same positions of q, k and v; the shard has 6 queries and 8 keys");
  expect_invalid(validate(valid_args(7)),
                 "q: causal ring attention takes zigzag shards of two equal chunks; a shard of 7 positions");
}

TEST(RingBackwardValidate, TravellingShardsAreContiguous) {
  RingBackwardArgs a = valid_args();
  a.v = TensorView::strided(at(0x300000), DType::kBFloat16, {2, 6, 2, 64}, {6 * 4 * 64, 4 * 64, 64, 1});
  expect_invalid(validate(a), "v: must be contiguous, as its shard travels whole between ranks");
  EXPECT_TRUE(validate(a, 0, 1).is_ok()) << "one rank sends nothing";
  // The gradients do not travel: any strides fa3::backward takes.
  a = valid_args();
  a.dk = TensorView::strided(at(0x800000), DType::kBFloat16, {2, 6, 2, 64}, {6 * 4 * 64, 4 * 64, 64, 1});
  EXPECT_TRUE(validate(a).is_ok()) << validate(a).to_string();
}

TEST(RingBackwardValidate, BackwardsRulesApplyToTheWholeShard) {
  RingBackwardArgs a = valid_args();
  a.dq.dtype = DType::kFloat16;
  expect_invalid(validate(a), "dq: dtype fp16 does not match q's dtype bf16");
  a = valid_args();
  a.lse = {};
  expect_invalid(validate(a), "lse: data pointer is null");
  a = valid_args();
  a.dout = TensorView::contiguous(at(0x500000), DType::kBFloat16, {2, 6, 3, 64});
  const Status s = validate(a);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dout"), std::string::npos) << s.message();
  a = valid_args();
  a.q = TensorView::contiguous(at(0x100000), DType::kBFloat16, {2, 6, 4, 136});
  a.k = TensorView::contiguous(at(0x200000), DType::kBFloat16, {2, 6, 2, 136});
  a.dq = a.q;
  a.dk = a.k;
  EXPECT_EQ(validate(a).code(), StatusCode::kNotSupported);
  EXPECT_NE(validate(a).message().find("q: head dim 136 is not supported"), std::string::npos) << validate(a).message();
}

TEST(RingBackwardValidate, WorkspaceLargeEnoughAlignedAndOnTheDevice) {
  RingBackwardArgs a = valid_args();
  const std::size_t need = backward_layout(a, 4, 6060).bytes;
  a.workspace_bytes = need - 1;
  expect_invalid(validate(a), "workspace: the ring of 4 ranks needs " + std::to_string(need) +
                                  " bytes (ring_backward_workspace_size), got " + std::to_string(need - 1));
  a.workspace = nullptr;
  expect_invalid(validate(a), "and a null pointer");
  a = valid_args();
  a.workspace = at(0x1000080);
  expect_invalid(validate(a), "workspace: must be 256-byte aligned");
  a = valid_args();
  ValidationTarget away = device_target();
  away.locate = [&a](const void* p) { return p == a.workspace ? std::string("host memory") : std::string(); };
  expect_invalid(validate(a, 1, 4, true, away), "workspace: pointer is host memory, not memory of the current CUDA device");
  // The size query checks everything else.
  a.workspace = nullptr;
  a.workspace_bytes = 0;
  EXPECT_TRUE(validate(a, 1, 4, false).is_ok());
}

TEST(RingBackwardValidate, OneRankNeedsTheBackwardsWorkspace) {
  RingBackwardArgs a = valid_args();
  a.workspace_bytes = 6059;
  expect_invalid(validate(a, 0, 1), "workspace: the ring of 1 rank needs 6060 bytes (ring_backward_workspace_size), got 6059");
  a.workspace_bytes = 6060;
  EXPECT_TRUE(validate(a, 0, 1).is_ok()) << validate(a, 0, 1).to_string();
}

}  // namespace
}  // namespace fa3::distributed::detail
