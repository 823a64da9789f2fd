// The deterministic non-causal backward's dQ order (hopper/bwd_dq_order.h), checked on
// the host against a sort: at every query block each key block of a head has one turn
// (a permutation of 0 .. n_blocks - 1), in the order of arrival (round, then the step
// at which the key block reaches the block, then the key block). A duplicate turn would
// hang the kernel; a missing one would too; an order against arrival would make tiles
// wait for ones that come later. Shapes with rounds that split heads, more key blocks in
// a round than query blocks, and one query block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "hopper/bwd_dq_order.h"

namespace fa3::hopper {
namespace {

struct Shape {
  int pairs, n_blocks, grid, m_blocks;
};

void check(const Shape& s) {
  for (int pair = 0; pair < s.pairs; ++pair) {
    std::vector<StaticDqOrder> orders;
    for (int n = 0; n < s.n_blocks; ++n) {
      orders.push_back(StaticDqOrder::of(pair, n, s.n_blocks, s.grid, s.m_blocks));
    }
    for (int n = 0; n < s.n_blocks; ++n) {
      // Every step visits a query block, each once.
      std::vector<int> seen(s.m_blocks, 0);
      for (int i = 0; i < s.m_blocks; ++i) ++seen[orders[n].block_at(i)];
      ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }))
          << "pair " << pair << " key block " << n;
    }
    for (int m = 0; m < s.m_blocks; ++m) {
      std::vector<std::tuple<std::int64_t, int, int>> arrival;  // (round, step, key block)
      for (int n = 0; n < s.n_blocks; ++n) {
        const std::int64_t tile = static_cast<std::int64_t>(pair) * s.n_blocks + n;
        const int step = (m - orders[n].start() + s.m_blocks) % s.m_blocks;
        ASSERT_EQ(orders[n].block_at(step), m);
        arrival.emplace_back(tile / s.grid, step, n);
      }
      std::sort(arrival.begin(), arrival.end());
      for (int rank = 0; rank < s.n_blocks; ++rank) {
        const int n = std::get<2>(arrival[rank]);
        ASSERT_EQ(orders[n].turn(m), rank)
            << "pair " << pair << " key block " << n << " query block " << m << " (n_blocks " << s.n_blocks << ", grid "
            << s.grid << ", m_blocks " << s.m_blocks << ")";
      }
    }
  }
}

TEST(BwdDqOrder, TurnsAreArrivalOrderAtEveryQueryBlock) {
  const Shape shapes[] = {
      {16, 128, 132, 256},  // hdim 128 16k: heads split across rounds of 132
      {64, 16, 132, 32},    // 2k, batch 4: eight heads and a part per round
      {8, 132, 132, 8},     // a round's key blocks outnumber the query blocks
      {3, 5, 4, 7},         // rounds smaller than a head
      {5, 3, 7, 1},         // one query block
      {2, 200, 132, 1000},  // a head longer than the grid
      {7, 9, 1, 5},         // a grid of one CTA
      {4, 1, 3, 6},         // one key block a head
  };
  for (const Shape& s : shapes) check(s);
}

// A tile's order is fixed by its coordinates and the grid: the same call gives the same
// turns (what makes the sums repeat bit for bit), and the first round's first key block
// starts at query block 0.
TEST(BwdDqOrder, StartsSpreadOverTheQueryBlocks) {
  const StaticDqOrder first = StaticDqOrder::of(0, 0, 16, 132, 32);
  EXPECT_EQ(first.first, 0);
  EXPECT_EQ(first.count, 16);
  EXPECT_EQ(first.start(), 0);
  const StaticDqOrder mid = StaticDqOrder::of(0, 8, 16, 132, 32);
  EXPECT_EQ(mid.start(), 16);
  // Pair 8 of 16 key blocks on 132 CTAs: key blocks 0-3 in round 0, 4-15 in round 1.
  const StaticDqOrder split_early = StaticDqOrder::of(8, 3, 16, 132, 32);
  EXPECT_EQ(split_early.first, 0);
  EXPECT_EQ(split_early.count, 4);
  EXPECT_EQ(split_early.index, 3);
  const StaticDqOrder split_late = StaticDqOrder::of(8, 4, 16, 132, 32);
  EXPECT_EQ(split_late.first, 4);
  EXPECT_EQ(split_late.count, 12);
  EXPECT_EQ(split_late.index, 0);
  EXPECT_EQ(split_late.turn(0), 4);  // after round 0's four, first of its round
}

// The order's 32-bit arithmetic holds where the launch takes it, and the launch refuses
// it (falling back to every tile from query block 0) beyond.
TEST(BwdDqOrder, FitsWithin32Bits) {
  EXPECT_TRUE(static_dq_order_fits(16, 128, 132, 256));
  EXPECT_TRUE(static_dq_order_fits(1, 1, 132, (std::int64_t{1} << 31) / 133 - 2));
  EXPECT_FALSE(static_dq_order_fits(1, 1, 132, (std::int64_t{1} << 31) / 133));
  EXPECT_FALSE(static_dq_order_fits(std::int64_t{1} << 20, std::int64_t{1} << 11, 132, 8));
}

}  // namespace
}  // namespace fa3::hopper
