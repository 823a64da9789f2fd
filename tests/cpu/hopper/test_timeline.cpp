// The forward timeline's records and buffer sizes (hopper/timeline.h), which
// scripts/timeline.py reads back.
#include <gtest/gtest.h>

#include "hopper/timeline.h"

namespace fa3::hopper {
namespace {

TEST(FwdTimeline, RecordsKeepEventBlockQueryBlockAndPair) {
  const std::uint64_t word = pack_record(FwdEvent::kPvDone, 513, 127, 40000);
  EXPECT_EQ(record_event(word), FwdEvent::kPvDone);
  EXPECT_EQ(record_block(word), 513);
  EXPECT_EQ(record_m_block(word), 127);
  EXPECT_EQ(record_pair(word), 40000);
  // The layout scripts/timeline.py unpacks.
  EXPECT_EQ(word, 4u | 513ull << 8 | 127ull << 24 | 40000ull << 40);
  // Fields past 16 bits keep their low bits and do not spill into the next.
  const std::uint64_t wide = pack_record(FwdEvent::kTurn, 0x12345, 0x10001, 0x1ffff);
  EXPECT_EQ(record_block(wide), 0x2345);
  EXPECT_EQ(record_m_block(wide), 1);
  EXPECT_EQ(record_pair(wide), 0xffff);
  EXPECT_EQ(record_event(wide), FwdEvent::kTurn);
}

TEST(FwdTimeline, CapacityKeepsTheBufferNearItsBudget) {
  // 132 CTAs of two consumer warpgroups: about 64 MiB in all.
  const int streams = 264;
  const int capacity = timeline_capacity(streams);
  EXPECT_GE(capacity, 8192);  // 16k keys at 128 a block, four stamps each, for every tile of the stream
  EXPECT_LE(static_cast<std::int64_t>(streams) * timeline_stream_words(capacity) * 8, 64ll << 20);
  EXPECT_EQ(timeline_capacity(1), 1 << 20);
  EXPECT_GE(timeline_capacity(1 << 24), 1);
}

}  // namespace
}  // namespace fa3::hopper
