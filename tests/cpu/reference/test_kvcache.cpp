// KV-cache calls on the CPU path (fa3::cpu::forward_with_kvcache): each sequence's result
// equals the fixed-length CPU forward on the keys it should see — bit for bit when no
// rotary embedding changes the inputs, within fp32 rounding of the rotated inputs when one
// does — with a contiguous cache, cache_batch_idx, leftpad, paged caches of page sizes 1,
// 3, 16, 64 and 256 (larger than the cache) in random page order, appends that cross page boundaries, rotary in both
// styles, every mask option, GQA and MQA; the appended rows are in the cache afterwards,
// NaN in entries no sequence may read never leaks, and num_splits changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fa3/cpu.h"
#include "host_tensor.h"
#include "kvcache_case.h"

namespace fa3::testing {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

KvCase base(const std::string& name) {
  KvCase c;
  c.name = name;
  c.seqlens = {5, 0, 17, 40};
  return c;
}

std::vector<KvCase> cases() {
  std::vector<KvCase> all;
  all.push_back(base("contiguous_gqa"));
  for (std::int64_t page : {1, 3, 16, 64, 256}) {
    KvCase c = base("paged" + std::to_string(page) + "_append_causal");
    c.page_size = page;
    c.seqlen_q = 3;
    c.seqlen_new = 3;
    c.seqlens = {14, 0, 15, 61};  // 14..16 and 15..17 cross boundaries of pages 3 and 16
    c.options.causal = true;
    all.push_back(c);
  }
  KvCase idx = base("batch_idx_mqa_window_softcap");
  idx.batch_idx = {3, 0, 5, 1};
  idx.nheads_kv = 1;
  idx.seqlen_q = 4;
  idx.seqlen_new = 2;
  idx.options.window_left = 6;
  idx.options.window_right = 1;
  idx.options.softcap = 3.f;
  all.push_back(idx);
  KvCase left = base("leftpad_paged16_causal");
  left.page_size = 16;
  left.leftpad = {2, 0, 17, 20};
  left.seqlen_q = 2;
  left.seqlen_new = 2;
  left.options.causal = true;
  all.push_back(left);
  KvCase rot_gptj = base("rotary_interleaved_paged3_causal");
  rot_gptj.dtype = DType::kFloat32;
  rot_gptj.page_size = 3;
  rot_gptj.seqlen_q = 2;
  rot_gptj.seqlen_new = 2;
  rot_gptj.rotary_dim = 16;
  rot_gptj.options.causal = true;
  all.push_back(rot_gptj);
  KvCase rot_neox = base("rotary_halves_leftpad_not_causal");
  rot_neox.dtype = DType::kFloat32;
  rot_neox.leftpad = {1, 0, 3, 0};
  rot_neox.seqlen_q = 3;
  rot_neox.seqlen_new = 1;
  rot_neox.rotary_dim = 32;
  rot_neox.interleaved = false;
  all.push_back(rot_neox);
  KvCase rot_pos = base("rotary_seqlens_window");
  rot_pos.dtype = DType::kFloat32;
  rot_pos.seqlen_q = 2;
  rot_pos.seqlen_new = 2;
  rot_pos.rotary_dim = 8;
  rot_pos.rotary_pos = {0, 7, 3, 20};
  rot_pos.options.window_left = 10;
  rot_pos.options.window_right = 0;
  all.push_back(rot_pos);
  KvCase sinks = base("sinks_chunk_head_dim_v_fp16");
  sinks.dtype = DType::kFloat16;
  sinks.head_dim_v = 48;
  sinks.sinks = true;
  sinks.seqlen_q = 5;
  sinks.seqlen_new = 5;
  sinks.seqlens = {5, 1, 17, 40};
  sinks.options.causal = true;
  sinks.options.attention_chunk = 8;
  all.push_back(sinks);
  return all;
}

class KvCacheTest : public ::testing::TestWithParam<KvCase> {};

// Bitwise equal, NaN never.
bool same(float a, float b) { return !std::isnan(a) && std::memcmp(&a, &b, sizeof a) == 0; }

TEST_P(KvCacheTest, EachSequenceEqualsTheFixedLengthCallOnItsKeys) {
  const KvCase& c = GetParam();
  KvCall call = make_kv_call(c, 11);
  const Status st = cpu::forward_with_kvcache(call.args());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const bool exact = c.rotary_dim == 0;
  for (std::int64_t b = 0; b < c.batch(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    if (c.seqlen_k(b) == 0) {
      for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
        for (std::int64_t h = 0; h < c.nheads_q; ++h) {
          EXPECT_EQ(call.lse.get({b, h, i, 0}), c.sinks ? call.sinks.get({h, 0, 0, 0}) : kNegInf);
          for (std::int64_t d = 0; d < c.head_dim_v; ++d) EXPECT_EQ(call.out.get({b, i, h, d}), 0.f);
        }
      }
      continue;
    }
    Attention e = call.expected_inputs(b);
    const Status fixed = cpu::forward(e.args());
    ASSERT_TRUE(fixed.is_ok()) << fixed.to_string();
    for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
      for (std::int64_t h = 0; h < c.nheads_q; ++h) {
        const float lse = call.lse.get({b, h, i, 0}), want_lse = e.lse.get({0, h, i, 0});
        if (exact) {
          EXPECT_TRUE(same(lse, want_lse) || (lse == kNegInf && want_lse == kNegInf)) << lse << " vs " << want_lse;
        } else {
          EXPECT_NEAR(lse, want_lse, 1e-4);
        }
        for (std::int64_t d = 0; d < c.head_dim_v; ++d) {
          const float got = call.out.get({b, i, h, d}), want = e.out.get({0, i, h, d});
          if (exact) {
            EXPECT_TRUE(same(got, want)) << "out(" << i << ", " << h << ", " << d << ") " << got << " vs " << want;
          } else {
            EXPECT_NEAR(got, want, 1e-4) << "out(" << i << ", " << h << ", " << d << ")";
          }
        }
      }
    }
  }
}

TEST_P(KvCacheTest, AppendedRowsAreInTheCache) {
  const KvCase& c = GetParam();
  if (c.seqlen_new == 0) GTEST_SKIP() << "nothing appended";
  KvCall call = make_kv_call(c, 12);
  ASSERT_TRUE(cpu::forward_with_kvcache(call.args()).is_ok());
  for (std::int64_t b = 0; b < c.batch(); ++b) {
    for (std::int64_t i = 0; i < c.seqlen_new; ++i) {
      const std::int64_t pos = c.seqlen(b) + i;
      for (std::int64_t h = 0; h < c.nheads_kv; ++h) {
        const std::vector<double> k = call.row(call.k_new, b, i, h, c.rotary_start(b) + i, c.head_dim);
        for (std::int64_t d = 0; d < c.head_dim; ++d) {
          const float got = call.cache_get(call.k_cache, b, pos, h, d);
          if (c.rotary_dim == 0) {
            EXPECT_TRUE(same(got, static_cast<float>(k[static_cast<std::size_t>(d)])));
          } else {
            EXPECT_NEAR(got, k[static_cast<std::size_t>(d)], 1e-5);
          }
        }
        for (std::int64_t d = 0; d < c.head_dim_v; ++d) {
          EXPECT_TRUE(same(call.cache_get(call.v_cache, b, pos, h, d), call.v_new.get({b, i, h, d})));
        }
      }
    }
  }
}

TEST_P(KvCacheTest, NumSplitsChangesNothing) {
  const KvCase& c = GetParam();
  KvCall one = make_kv_call(c, 13);
  KvCall split = make_kv_call(c, 13);
  KvCacheArgs args = split.args();
  args.num_splits = 3;
  ASSERT_TRUE(cpu::forward_with_kvcache(one.args()).is_ok());
  ASSERT_TRUE(cpu::forward_with_kvcache(args).is_ok());
  EXPECT_EQ(one.out.values(), split.out.values());
  EXPECT_EQ(one.lse.values(), split.lse.values());
}

INSTANTIATE_TEST_SUITE_P(Cases, KvCacheTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<KvCase>& info) { return info.param.name; });

}  // namespace
}  // namespace fa3::testing
