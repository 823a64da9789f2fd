// The FP8 forward's hand-off of P between its two GEMMs (hopper/fp8_layout.h), checked
// against CuTe's register layouts of the wgmma fragments (which follow the PTX ISA's
// figures): every e4m3 A operand value a thread converts from its own f32 accumulator
// lies in the same row, and the key it carries is the one Vᵀ holds at the operand's k.
#include <gtest/gtest.h>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <set>

#include "hopper/fp8_layout.h"

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

}  // namespace
}  // namespace fa3::hopper
