// fa3 — the forward kernel's timeline, for performance work (the build's FA3_FWD_TIMELINE,
// off by default: hopper/fwd_config.h's kFwdTimeline).
//
// Profilers give where warps stall, summed over a launch; they do not say how long one
// consumer warpgroup's softmax of one key block took, or how long it then waited for
// its ping-pong turn, which is what the forward's overlap depends on. With the option,
// the first thread of each consumer warpgroup stamps its SM's cycle counter at a few
// points of every key block (FwdEvent) into a buffer that the launch reads back and
// appends to the file named by the environment's FA3_FWD_TIMELINE
// (scripts/timeline.py summarizes it). The stamps cost a few instructions a block and
// the launch then synchronizes its stream: a diagnosis build, not one to time against
// others' kernels.
//
// Layout: each (CTA, consumer warpgroup) owns `capacity` records of two 64-bit words, the
// counter and pack_record's word; a stream stops recording when full (its count, written
// at each tile's end, says how many it wanted). The file holds, per launch, a TimelineHeader, then the kernel's
// name (name_bytes bytes), then streams × (one 64-bit count, capacity records).
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace fa3::hopper {

// Points of a consumer warpgroup's work, in the order they occur for a key block.
enum class FwdEvent : std::uint8_t {
  kTileStart = 0,  // a tile's statistics are set up, before its first GEMMs
  kTurn = 1,       // the ping-pong turn is this warpgroup's: its GEMMs issue next
  kScores = 2,     // S = Q·Kᵀ of the block has landed in registers
  kProbs = 3,      // the block's softmax is done (P in fp32, rescale decided)
  kPvDone = 4,     // the previous block's P·V has completed
  kTileEnd = 5,    // the tile's output is handed to its store
};
inline constexpr int kFwdEventCount = 6;

// The second word of a record: the event, the key block, the tile's query block and its
// (batch, head) pair's index, the last three kept to their low 16 bits.
FA3_HOST_DEVICE constexpr std::uint64_t pack_record(FwdEvent event, int block, int m_block, int pair) {
  return static_cast<std::uint64_t>(static_cast<std::uint8_t>(event)) |
         static_cast<std::uint64_t>(static_cast<std::uint16_t>(block)) << 8 |
         static_cast<std::uint64_t>(static_cast<std::uint16_t>(m_block)) << 24 |
         static_cast<std::uint64_t>(static_cast<std::uint16_t>(pair)) << 40;
}
FA3_HOST_DEVICE constexpr FwdEvent record_event(std::uint64_t word) { return static_cast<FwdEvent>(word & 0xffu); }
FA3_HOST_DEVICE constexpr int record_block(std::uint64_t word) { return static_cast<int>((word >> 8) & 0xffffu); }
FA3_HOST_DEVICE constexpr int record_m_block(std::uint64_t word) { return static_cast<int>((word >> 24) & 0xffffu); }
FA3_HOST_DEVICE constexpr int record_pair(std::uint64_t word) { return static_cast<int>((word >> 40) & 0xffffu); }

// 64-bit words a launch's buffer holds: per stream its count, then its records.
FA3_HOST_DEVICE constexpr std::int64_t timeline_stream_words(int capacity) {
  return 1 + 2 * static_cast<std::int64_t>(capacity);
}

struct TimelineHeader {
  char magic[8];             // "fa3tl01\0"
  std::uint32_t streams;     // CTAs × consumer warpgroups; stream = cta * warpgroups + wg
  std::uint32_t warpgroups;  // consumer warpgroups per CTA
  std::uint32_t capacity;    // records per stream
  std::uint32_t block_n;     // keys per block of the kernel
  std::uint32_t clock_khz;   // the GPU's SM clock rating (cycles to time, roughly)
  std::uint32_t name_bytes;  // the kernel's name that follows the header
};
static_assert(sizeof(TimelineHeader) == 32, "scripts/timeline.py reads the header as 32 bytes");
inline constexpr char kTimelineMagic[8] = {'f', 'a', '3', 't', 'l', '0', '1', '\0'};

// Records per stream a launch gets: enough for every block of the stream's tiles at
// long lengths (four stamps a block), bounded so that the buffer stays near 64 MiB.
inline int timeline_capacity(int streams) {
  constexpr std::int64_t kBudgetWords = 8ll << 20;
  const std::int64_t per = kBudgetWords / (streams > 0 ? streams : 1);
  const std::int64_t records = (per - 1) / 2;
  return static_cast<int>(records < 1 ? 1 : (records > (1 << 20) ? (1 << 20) : records));
}

}  // namespace fa3::hopper
