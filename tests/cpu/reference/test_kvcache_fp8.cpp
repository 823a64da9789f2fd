// KV-cache calls with e4m3 q, caches and appended rows on the CPU path: each sequence
// equals the fixed-length FP8 call on its keys with its own row of each descale, bit
// for bit, the appended codes land in the cache unchanged, and the FP8 rules of a
// KV-cache call (descales only, no rotary embedding, bf16 / fp16 out, the GPU's
// refusal) are refused by name with nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "api/validate_kvcache.h"
#include "fa3/cpu.h"
#include "kvcache_case.h"

namespace fa3::testing {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<KvCase> cases() {
  KvCase contiguous;
  contiguous.name = "contiguous_gqa";
  contiguous.seqlens = {5, 0, 17, 40};
  KvCase paged = contiguous;
  paged.name = "paged3_append_causal_mqa";
  paged.page_size = 3;
  paged.seqlen_q = 3;
  paged.seqlen_new = 3;
  paged.nheads_kv = 1;
  paged.seqlens = {14, 0, 15, 61};
  paged.options.causal = true;
  std::vector<KvCase> all = {contiguous, paged};
  for (KvCase& c : all) c.dtype = DType::kFloat8E4M3;
  return all;
}

// A call of `c` with bf16 out and a random descale per (sequence, kv head) for each of
// q, k and v.
struct Fp8KvCall {
  KvCall call;
  HostTensor descales[3];

  Fp8KvCall(const KvCase& c, std::uint64_t seed) : call(make_kv_call(c, seed)) {
    call.out = HostTensor(DType::kBFloat16, {c.batch(), c.seqlen_q, c.nheads_q, c.head_dim_v});
    std::mt19937_64 rng(seed + 1);
    std::uniform_real_distribution<float> scale(0.25f, 2.f);
    for (HostTensor& d : descales) {
      d = HostTensor(DType::kFloat32, {c.batch(), c.nheads_kv});
      d.for_each([&](const Index& i, std::int64_t) { d.set(i, scale(rng)); });
    }
  }

  KvCacheArgs args() {
    KvCacheArgs a = call.args();
    a.fp8.q_descale = descales[0].view();
    a.fp8.k_descale = descales[1].view();
    a.fp8.v_descale = descales[2].view();
    return a;
  }
};

bool same(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

class Fp8KvCacheTest : public ::testing::TestWithParam<KvCase> {};

TEST_P(Fp8KvCacheTest, EachSequenceEqualsTheFixedLengthFp8CallOnItsKeys) {
  const KvCase& c = GetParam();
  Fp8KvCall fp8(c, 21);
  const Status st = cpu::forward_with_kvcache(fp8.args());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  for (std::int64_t b = 0; b < c.batch(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    if (c.seqlen_k(b) == 0) {
      for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
        for (std::int64_t h = 0; h < c.nheads_q; ++h) {
          EXPECT_EQ(fp8.call.lse.get({b, h, i, 0}), kNegInf);
          for (std::int64_t d = 0; d < c.head_dim_v; ++d) EXPECT_EQ(fp8.call.out.get({b, i, h, d}), 0.f);
        }
      }
      continue;
    }
    Attention e = fp8.call.expected_inputs(b);
    e.out = HostTensor(DType::kBFloat16, {1, c.seqlen_q, c.nheads_q, c.head_dim_v});
    HostTensor rows[3];
    ForwardArgs alone = e.args();
    TensorView* views[3] = {&alone.fp8.q_descale, &alone.fp8.k_descale, &alone.fp8.v_descale};
    for (int t = 0; t < 3; ++t) {
      rows[t] = HostTensor(DType::kFloat32, {1, c.nheads_kv});
      rows[t].for_each([&](const Index& i, std::int64_t) { rows[t].set(i, fp8.descales[t].get({b, i[1], 0, 0})); });
      *views[t] = rows[t].view();
    }
    const Status fixed = cpu::forward(alone);
    ASSERT_TRUE(fixed.is_ok()) << fixed.to_string();
    for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
      for (std::int64_t h = 0; h < c.nheads_q; ++h) {
        EXPECT_TRUE(same(fp8.call.lse.get({b, h, i, 0}), e.lse.get({0, h, i, 0})));
        for (std::int64_t d = 0; d < c.head_dim_v; ++d) {
          ASSERT_TRUE(same(fp8.call.out.get({b, i, h, d}), e.out.get({0, i, h, d})))
              << "out(" << i << ", " << h << ", " << d << ")";
        }
      }
    }
  }
  if (c.seqlen_new > 0) {
    for (std::int64_t b = 0; b < c.batch(); ++b) {
      for (std::int64_t i = 0; i < c.seqlen_new; ++i) {
        for (std::int64_t h = 0; h < c.nheads_kv; ++h) {
          for (std::int64_t d = 0; d < c.head_dim; ++d) {
            ASSERT_TRUE(
                same(fp8.call.cache_get(fp8.call.k_cache, b, c.seqlen(b) + i, h, d), fp8.call.k_new.get({b, i, h, d})));
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8, Fp8KvCacheTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<KvCase>& info) { return info.param.name; });

// The rules an e4m3 call adds, each refused with its message and nothing written.
TEST(Fp8KvCacheRules, EachIsRefusedByName) {
  KvCase c = cases().back();
  c.rotary_dim = 8;
  struct Rule {
    const char* name;
    void (*breaks)(KvCacheArgs&, Fp8KvCall&);
    const char* message;
  };
  const Rule rules[] = {
      {"rotary", [](KvCacheArgs&, Fp8KvCall&) {},
       "rotary_cos: a rotary embedding of e4m3 inputs is not supported; rotate before quantizing"},
      {"block scales", [](KvCacheArgs& a, Fp8KvCall& f) { a.fp8.k_block_scale = f.descales[0].view(); },
       "k_block_scale: block scales are not supported in KV-cache calls; give q/k/v_descale"},
      {"out e4m3", [](KvCacheArgs& a, Fp8KvCall&) { a.out.dtype = DType::kFloat8E4M3; },
       "out: dtype must be bf16 or fp16 for e4m3 inputs, got e4m3"},
      {"descale per query head", [](KvCacheArgs& a, Fp8KvCall&) { a.fp8.v_descale.shape[1] = 4; },
       "v_descale: shape (4, 4) must be (batch, nheads_kv) = (4, 1)"},
  };
  for (const Rule& rule : rules) {
    SCOPED_TRACE(rule.name);
    KvCase k = c;
    if (std::string(rule.name) != "rotary") k.rotary_dim = 0;
    Fp8KvCall fp8(k, 5);
    KvCacheArgs a = fp8.args();
    rule.breaks(a, fp8);
    fp8.call.out.fill_nan();
    const std::vector<double> cache_before = fp8.call.k_cache.values();
    const Status s = cpu::forward_with_kvcache(a);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), rule.message);
    fp8.call.out.for_each([&](const Index& i, std::int64_t) { ASSERT_TRUE(std::isnan(fp8.call.out.get(i))); });
    const std::vector<double> cache_after = fp8.call.k_cache.values();
    for (std::size_t i = 0; i < cache_before.size(); ++i) {
      ASSERT_TRUE(same(static_cast<float>(cache_after[i]), static_cast<float>(cache_before[i])) ||
                  (std::isnan(cache_after[i]) && std::isnan(cache_before[i])))
          << "the cache was written";
    }
  }
}

// A device target runs e4m3 KV-cache calls only where it says so, after every other rule.
TEST(Fp8KvCacheRules, DeviceTargetRefusesThemLast) {
  Fp8KvCall fp8(cases().front(), 6);
  ValidationTarget t;
  t.space = ValidationTarget::Space::kDevice;
  t.dtypes = {DType::kBFloat16, DType::kFloat16};
  t.supports_kvcache = true;
  KvCacheProblem p;
  Status s = validate_kvcache(fp8.args(), t, &p);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_EQ(s.message(),
            "q: e4m3 (FP8) KV-cache calls are not supported on the GPU yet (fa3::cpu::forward_with_kvcache runs them)");
  KvCacheArgs broken = fp8.args();
  broken.fp8.q_descale.shape[0] = 3;
  s = validate_kvcache(broken, t, &p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "q_descale: shape (3, 2) must be (batch, nheads_kv) = (4, 2)");
  t.supports_fp8_kvcache = true;
  s = validate_kvcache(fp8.args(), t, &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

}  // namespace
}  // namespace fa3::testing
