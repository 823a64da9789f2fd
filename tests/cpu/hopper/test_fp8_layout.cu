// The FP8 forward's hand-off of P between its two GEMMs (hopper/fp8_layout.h), checked
// against CuTe's register layouts of the wgmma fragments (which follow the PTX ISA's
// figures): every e4m3 A operand value a thread converts from its own f32 accumulator
// lies in the same row, and the key it carries is the one Vᵀ holds at the operand's k.
// And where a varlen call's sequences lie in Vᵀ.
#include <gtest/gtest.h>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cstdint>
#include <set>
#include <vector>

#include "hopper/fp8_layout.h"
#include "hopper/fp8_vt.h"
#include "hopper/fwd_dispatch.h"

namespace fa3::hopper {
namespace {

TEST(Fp8Layout, VtKeysPermuteEachGroupOf16) {
  std::set<int> keys;
  for (int k = 0; k < 16; ++k) keys.insert(fp8_vt_key(k));
  EXPECT_EQ(keys.size(), 16u);
  EXPECT_EQ(*keys.begin(), 0);
  EXPECT_EQ(*keys.rbegin(), 15);
  EXPECT_EQ(kFp8VtKeyAlign % 16, 0);
}

TEST(Fp8Layout, PSourcesAreEachAccumulatorValueOnce) {
  std::set<int> sources;
  for (int a = 0; a < 16; ++a) sources.insert(fp8_p_source(a));
  EXPECT_EQ(sources.size(), 16u);
  EXPECT_EQ(*sources.rbegin(), 15);
}

// Accumulator of m64nN (N keys) -> A operand of m64nNk32, one 32-key slice at a time.
template <int kN>
void expect_same_row_and_vt_key() {
  using namespace cute;
  const auto acc = SM90::GMMA::CLayout_64xN<kN>{};  // (thread, value) -> row + 64 * key
  const auto op = SM90::GMMA::ALayout_64x32{};      // (thread, value) -> row + 64 * k
  int checked = 0;
  for (int thr = 0; thr < 128; ++thr) {
    for (int slice = 0; slice < kN / 32; ++slice) {
      for (int a = 0; a < 16; ++a) {
        const int at_a = op(thr, a);
        const int at_acc = acc(thr, 16 * slice + fp8_p_source(a));
        const int k = at_a / 64;
        ASSERT_EQ(at_acc % 64, at_a % 64) << "thread " << thr << " value " << a << ": rows differ";
        ASSERT_EQ(at_acc / 64, 32 * slice + k / 16 * 16 + fp8_vt_key(k % 16))
            << "thread " << thr << " slice " << slice << " value " << a << ": key is not Vᵀ's at k " << k;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 128 * kN / 2);
}

TEST(Fp8Layout, AccumulatorRegistersAreThePOperandInVtOrder) {
  expect_same_row_and_vt_key<32>();
  expect_same_row_and_vt_key<64>();
  expect_same_row_and_vt_key<128>();
  expect_same_row_and_vt_key<256>();
}

// A varlen call's Vᵀ (hopper/fp8_vt.h): each sequence starts 16-byte aligned, its keys
// and kFp8VtTail columns after them end before the next sequence starts, and the last
// one's inside the buffer's keys, for lengths 0, 1, odd, aligned and long.
TEST(Fp8Layout, VarlenVtSequencesKeepTheirTailsApart) {
  const std::vector<std::vector<long long>> batches = {
      {0}, {1}, {0, 0, 0}, {15, 16, 17}, {1, 0, 2047, 128, 129, 3}, {100000, 1, 70000}};
  for (const std::vector<long long>& lens : batches) {
    long long offset = 0;
    long long end = 0;
    for (std::size_t b = 0; b < lens.size(); ++b) {
      const long long start = fp8_vt_seq_start(offset, static_cast<long long>(b));
      EXPECT_EQ(start % 16, 0);
      EXPECT_GE(start, end) << "sequence " << b << " starts inside the one before";
      end = start + lens[b] + kFp8VtTail;
      offset += lens[b];
    }
    const std::int64_t keys = fp8_vt_varlen_keys(offset, static_cast<std::int64_t>(lens.size()));
    EXPECT_GE(keys, end);
    EXPECT_EQ(keys % kFp8VtKeyAlign, 0);
  }
}

// Every FP8 tile's key block fits in a sequence's zero tail, so that it reads no key of
// the next sequence (the kernels' traits assert it too).
TEST(Fp8Layout, Fp8KeyBlocksFitTheTail) {
  for (const FwdKernelEntry& k : fwd_kernels()) {
    if (k.dtype == DType::kFloat8E4M3) EXPECT_LE(k.tile.block_n, kFp8VtTail) << k.name();
  }
}

}  // namespace
}  // namespace fa3::hopper
