// The dispatcher's choice among the compiled forward kernels (hopper/fwd_dispatch.cpp),
// checked on the host: ranking the candidates needs the build's kernel list, not a GPU.
// A rule is checked only where the build holds every tile it chooses among (a trimmed
// build, or CI's representative set, holds some).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "api/problem.h"
#include "hopper/fwd_dispatch.h"

namespace fa3::hopper {
namespace {

bool built(int head_dim) {
  const std::vector<int> dims = fwd_head_dims();
  return std::find(dims.begin(), dims.end(), head_dim) != dims.end();
}

Problem problem(int head_dim, bool causal, std::int64_t seqlen_q, std::int64_t seqlen_k) {
  Problem p;
  p.batch = 1;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.nheads_q = 2;
  p.nheads_kv = 2;
  p.head_dim = p.head_dim_v = head_dim;
  p.softmax_scale = 0.1f;
  p.causal = causal;
  p.window_right = causal ? 0 : -1;
  return p;
}

MaskKind kind(bool causal) { return causal ? MaskKind::kCausal : MaskKind::kPlain; }

// Whether the build's first dtype has all of these tiles for (head dim, mask).
bool all_built(int head_dim, bool causal, std::initializer_list<std::string> names) {
  if (fwd_dtypes().empty()) return false;
  return std::all_of(names.begin(), names.end(), [&](const std::string& name) {
    return std::any_of(fwd_kernels().begin(), fwd_kernels().end(), [&](const FwdKernelEntry& k) {
      return k.dtype == fwd_dtypes().front() && k.head_dim == head_dim && k.mask == kind(causal) && k.name() == name;
    });
  });
}

// The kernel fa3::forward runs by default, for the build's first dtype.
std::string first(int head_dim, bool causal, std::int64_t seqlen_q, std::int64_t seqlen_k) {
  if (fwd_dtypes().empty()) return "(no kernels built)";
  const std::vector<const FwdKernelEntry*> c =
      fwd_candidates(problem(head_dim, causal, seqlen_q, seqlen_k), fwd_dtypes().front());
  return c.empty() ? std::string("(none)") : c.front()->name();
}

TEST(FwdDispatch, EveryBuiltKernelIsACandidateOnce) {
  for (DType dtype : fwd_dtypes()) {
    std::set<std::pair<int, int>> dims;
    for (const FwdKernelEntry& k : fwd_kernels()) dims.insert({k.head_dim, k.head_dim_v});
    for (const auto& [d, dv] : dims) {
      for (bool causal : {false, true}) {
        SCOPED_TRACE(testing::Message() << "hdim " << d << " v " << dv << (causal ? " causal" : ""));
        const auto built_here = std::count_if(fwd_kernels().begin(), fwd_kernels().end(), [&](const auto& k) {
          return k.dtype == dtype && k.head_dim == d && k.head_dim_v == dv && k.mask == kind(causal);
        });
        for (std::int64_t keys : {1, 512, 1024, 4096, 16384}) {
          Problem p = problem(d, causal, 512, keys);
          p.head_dim_v = dv;
          const std::vector<const FwdKernelEntry*> c = fwd_candidates(p, dtype);
          std::set<std::string> names;
          for (const FwdKernelEntry* k : c) names.insert(k->name());
          EXPECT_EQ(static_cast<std::int64_t>(c.size()), built_here) << keys << " keys";
          EXPECT_EQ(names.size(), c.size()) << keys << " keys";
        }
      }
    }
  }
}

// A window or softcap runs the general kernel of its head dim, never a plain or causal
// one; it is the only general one.
TEST(FwdDispatch, WindowAndSoftcapRunTheGeneralKernel) {
  for (DType dtype : fwd_dtypes()) {
    for (int d : fwd_head_dims()) {
      SCOPED_TRACE(testing::Message() << "hdim " << d);
      const auto general = std::count_if(fwd_kernels().begin(), fwd_kernels().end(), [&](const auto& k) {
        return k.dtype == dtype && k.head_dim == d && k.mask == MaskKind::kGeneral;
      });
      EXPECT_LE(general, 1);
      Problem window = problem(d, true, 4096, 4096);
      window.window_left = 256;
      Problem softcap = problem(d, false, 4096, 4096);
      softcap.softcap = 30.f;
      for (const Problem& p : {window, softcap}) {
        const std::vector<const FwdKernelEntry*> c = fwd_candidates(p, dtype);
        EXPECT_EQ(static_cast<std::int64_t>(c.size()), general);
        for (const FwdKernelEntry* k : c) EXPECT_EQ(k->mask, MaskKind::kGeneral);
      }
    }
  }
}

// A varlen call runs on kernels that carry the varlen paths: its own family's, or the
// general one at head dim 64, whose plain and causal kernels leave them out.
TEST(FwdDispatch, VarlenCallsRunOnKernelsThatCarryTheVarlenPaths) {
  for (DType dtype : fwd_dtypes()) {
    for (int d : fwd_head_dims()) {
      for (bool causal : {false, true}) {
        SCOPED_TRACE(testing::Message() << "hdim " << d << (causal ? " causal" : ""));
        Problem p = problem(d, causal, 1000, 1000);
        p.varlen = true;
        const MaskKind want = fwd_family_carries_varlen(d, false) ? kind(causal) : MaskKind::kGeneral;
        const std::vector<const FwdKernelEntry*> c = fwd_candidates(p, dtype);
        for (const FwdKernelEntry* k : c) EXPECT_EQ(k->mask, want) << k->name();
        p.varlen = false;
        for (const FwdKernelEntry* k : fwd_candidates(p, dtype)) EXPECT_EQ(k->mask, kind(causal)) << k->name();
      }
    }
  }
}

// Head dim 64 prefers four warpgroups of 64-key blocks while rows of keys are short
// and three of 128-key blocks beyond; the query length does not enter the choice.
TEST(FwdDispatch, HeadDim64TileFollowsKeyLength) {
  if (!all_built(64, false, {"256x64", "192x128"}) || !all_built(64, true, {"256x64", "192x128"})) {
    GTEST_SKIP() << "head dim 64's tiles not all built";
  }
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    EXPECT_EQ(first(64, causal, 512, 512), "256x64");
    EXPECT_EQ(first(64, causal, 4096, 1024), "256x64");
    EXPECT_EQ(first(64, causal, 1024, 1025), "192x128");
    EXPECT_EQ(first(64, causal, 4096, 4096), "192x128");
  }
}

// Non-causal head dims 96 to 256 run CTA pairs that share K/V loads from 4096 keys on
// and single CTAs below; causal ones never pair, nor does head dim 64.
TEST(FwdDispatch, SharedKeyValueLoadsFollowKeyLength) {
  const std::pair<int, std::string> tiles[] = {{96, "128x128"}, {128, "128x128"}, {192, "128x96"}, {256, "128x80"}};
  for (const auto& [d, tile] : tiles) {
    if (!all_built(d, false, {tile, tile + "-c2"})) continue;
    SCOPED_TRACE(testing::Message() << "hdim " << d);
    EXPECT_EQ(first(d, false, 512, 4096), tile + "-c2");
    EXPECT_EQ(first(d, false, 4096, 16384), tile + "-c2");
    EXPECT_EQ(first(d, false, 4096, 4095), tile);
    EXPECT_EQ(first(d, true, 4096, 4096).find("-c2"), std::string::npos);
  }
  if (built(64)) EXPECT_EQ(first(64, false, 4096, 16384).find("-c2"), std::string::npos);
}

// Non-causal head dim 256 below 4096 keys runs the key block that pads a row's keys
// less, counting 64-key blocks 3 % dearer per key; causal rows run 64-key blocks.
TEST(FwdDispatch, HeadDim256KeyBlockFollowsPadding) {
  if (!all_built(256, false, {"128x64", "128x80"}) || !all_built(256, true, {"128x64"})) {
    GTEST_SKIP() << "head dim 256's tiles not all built";
  }
  const std::pair<std::int64_t, std::string> cases[] = {{512, "128x64"},  {768, "128x64"},  {1024, "128x80"},
                                                        {1536, "128x64"}, {2048, "128x80"}, {2000, "128x80"},
                                                        {4095, "128x80"}};
  for (const auto& [keys, tile] : cases) {
    SCOPED_TRACE(testing::Message() << keys << " keys");
    EXPECT_EQ(first(256, false, 256, keys), tile);
    EXPECT_EQ(first(256, true, 256, keys), "128x64");
  }
}

// Head dims run on the narrowest compiled kernel at least as wide in both the Q/K and
// the V head dim: one of their own (d, dv) when built, else one of equal head dims.
TEST(FwdDispatch, HeadDimsRunOnTheNarrowestKernelThatFits) {
  const int dims[] = {1, 8, 40, 64, 100, 128, 160, 192, 200, 256};
  for (int d : dims) {
    for (int dv : dims) {
      SCOPED_TRACE(testing::Message() << "head dims " << d << ", " << dv);
      const HeadDims got = fwd_kernel_head_dims(d, dv);
      int narrowest = 0;
      for (const FwdKernelEntry& k : fwd_kernels()) {
        if (k.dtype == DType::kFloat8E4M3) continue;  // e4m3 calls choose among their own
        if (k.head_dim >= d && k.head_dim_v >= dv && (narrowest == 0 || k.head_dim + k.head_dim_v < narrowest)) {
          narrowest = k.head_dim + k.head_dim_v;
        }
      }
      EXPECT_EQ(got.qk + got.v, narrowest);
      if (narrowest > 0) {
        EXPECT_GE(got.qk, d);
        EXPECT_GE(got.v, dv);
      }
    }
  }
  for (const FwdKernelEntry& k : fwd_kernels()) {
    if (k.head_dim != k.head_dim_v) continue;
    const HeadDims same = fwd_kernel_head_dims(k.head_dim, k.head_dim, k.dtype == DType::kFloat8E4M3);
    EXPECT_EQ(same.qk, k.head_dim);
    EXPECT_EQ(same.v, k.head_dim);
  }
  const auto has = [](int d, int dv) {
    return std::any_of(fwd_kernels().begin(), fwd_kernels().end(),
                       [&](const FwdKernelEntry& k) { return k.head_dim == d && k.head_dim_v == dv; });
  };
  if (has(192, 128) && has(192, 192)) {
    // DeepSeek-V3's prefill shape, and smaller ones, on the (192, 128) kernel.
    for (auto [d, dv] : {std::pair{192, 128}, std::pair{150, 100}, std::pair{129, 128}}) {
      const HeadDims got = fwd_kernel_head_dims(d, dv);
      EXPECT_EQ(got.qk, 192) << d << ", " << dv;
      EXPECT_EQ(got.v, 128) << d << ", " << dv;
    }
  }
  if (has(64, 256)) {
    const HeadDims got = fwd_kernel_head_dims(64, 256);
    EXPECT_EQ(got.qk, 64);
    EXPECT_EQ(got.v, 256);
  }
}

// e4m3 calls run the FP8 kernels (FA3_GPU_FP8) of their out dtype, on the narrowest
// FP8 head dim that fits; 16-bit calls never run an FP8 kernel.
TEST(FwdDispatch, E4m3CallsRunTheFp8KernelsOfTheirOutDtype) {
  int fp8_kernels = 0;
  for (const FwdKernelEntry& k : fwd_kernels()) {
    if (k.dtype != DType::kFloat8E4M3) continue;
    ++fp8_kernels;
    SCOPED_TRACE(testing::Message() << "hdim " << k.head_dim << " out " << dtype_name(k.out_dtype));
    EXPECT_TRUE(k.out_dtype == DType::kBFloat16 || k.out_dtype == DType::kFloat16);
    const bool causal = k.mask == MaskKind::kCausal;
    const std::vector<const FwdKernelEntry*> c =
        fwd_candidates(problem(k.head_dim, causal, 1000, 1000), DType::kFloat8E4M3, k.out_dtype);
    ASSERT_FALSE(c.empty());
    for (const FwdKernelEntry* e : c) {
      EXPECT_EQ(e->dtype, DType::kFloat8E4M3);
      EXPECT_EQ(e->out_dtype, k.out_dtype);
      EXPECT_EQ(e->head_dim, k.head_dim);
      EXPECT_EQ(e->mask, k.mask);
    }
    // A head dim just below runs on this kernel or a narrower FP8 one that fits.
    const HeadDims below = fwd_kernel_head_dims(k.head_dim - 8, k.head_dim - 8, true);
    EXPECT_GE(below.qk, k.head_dim - 8);
    EXPECT_LE(below.qk, k.head_dim);
  }
  // Every head dim in whole 16-byte rows runs on the narrowest FP8 head dim built at
  // least as wide (with every head dim built: 80 on 96, 160 on 192).
  for (int d = 16; d <= 256; d += 16) {
    int narrowest = 0;
    for (const FwdKernelEntry& k : fwd_kernels()) {
      if (k.dtype == DType::kFloat8E4M3 && k.head_dim >= d && (narrowest == 0 || k.head_dim < narrowest)) {
        narrowest = k.head_dim;
      }
    }
    const HeadDims got = fwd_kernel_head_dims(d, d, true);
    EXPECT_EQ(got.qk, narrowest) << "head dim " << d;
    EXPECT_EQ(got.v, narrowest) << "head dim " << d;
  }
  for (DType dtype : fwd_dtypes()) {
    EXPECT_NE(dtype, DType::kFloat8E4M3);
    for (int d : fwd_head_dims()) {
      for (const FwdKernelEntry* e : fwd_candidates(problem(d, false, 1000, 1000), dtype)) {
        EXPECT_EQ(e->dtype, dtype);
        EXPECT_EQ(e->out_dtype, dtype);
      }
    }
  }
  if (fp8_kernels == 0) GTEST_SKIP() << "no FP8 kernels built (FA3_GPU_FP8)";
}

// Block scales give one scale per 128 rows of q, k and v, which a tile reads once per
// query block and once per key block: calls with them run only on tiles whose blocks
// divide 128 (not on a wider FP8 tile such as FlashAttention-3's 128x224 or 192x160,
// FA3_FP8_FWD_TILES_<hdim>); calls without them may run on any tile of the build.
// FP8 head dim 128: plain calls take the 128x224 tile from 1025 keys on and 128x128 on
// shorter rows (measured: docs/perf-log.md); calls with block scales always 128x128.
TEST(FwdDispatch, Fp8HeadDim128TileFollowsKeyLength) {
  bool wide = false, square = false;
  for (const FwdKernelEntry& k : fwd_kernels()) {
    if (k.dtype != DType::kFloat8E4M3 || k.out_dtype != DType::kBFloat16 || k.head_dim != 128) continue;
    if (k.mask != MaskKind::kPlain) continue;
    wide = wide || k.name() == "128x224";
    square = square || k.name() == "128x128";
  }
  if (!wide || !square) GTEST_SKIP() << "FP8 head dim 128's plain tiles 128x224 and 128x128 not both built";
  const auto fp8_first = [](bool causal, std::int64_t seqlen_q, std::int64_t seqlen_k, bool block_scales) {
    Problem p = problem(128, causal, seqlen_q, seqlen_k);
    p.fp8_block_scales = block_scales;
    const std::vector<const FwdKernelEntry*> c = fwd_candidates(p, DType::kFloat8E4M3, DType::kBFloat16);
    return c.empty() ? std::string("(none)") : c.front()->name();
  };
  EXPECT_EQ(fp8_first(false, 512, 512, false), "128x128");
  EXPECT_EQ(fp8_first(false, 4096, 1024, false), "128x128");
  EXPECT_EQ(fp8_first(false, 1024, 1025, false), "128x224");
  EXPECT_EQ(fp8_first(false, 4096, 4096, false), "128x224");
  EXPECT_EQ(fp8_first(false, 4096, 4096, true), "128x128");
  EXPECT_EQ(fp8_first(true, 4096, 4096, false), "128x128");
}

// FP8 head dim 192: 128x160 from 1025 keys on, plain and causal, 128x128 on shorter rows
// and for block-scaled calls (measured: docs/perf-log.md). Head dim 96: 192x128 for
// every call without block scales. Head dim 256: 128x128, but 128x64 for causal rows of
// up to 1k keys.
TEST(FwdDispatch, Fp8HeadDims96To256Tiles) {
  const auto built = [](int head_dim, const char* name) {
    for (const FwdKernelEntry& k : fwd_kernels()) {
      if (k.dtype == DType::kFloat8E4M3 && k.out_dtype == DType::kBFloat16 && k.head_dim == head_dim &&
          k.name() == name) {
        return true;
      }
    }
    return false;
  };
  const auto fp8_first = [](int head_dim, bool causal, std::int64_t seqlen_k, bool block_scales) {
    Problem p = problem(head_dim, causal, 2048, seqlen_k);
    p.fp8_block_scales = block_scales;
    const std::vector<const FwdKernelEntry*> c = fwd_candidates(p, DType::kFloat8E4M3, DType::kBFloat16);
    return c.empty() ? std::string("(none)") : c.front()->name();
  };
  int checked = 0;
  if (built(192, "128x160") && built(192, "128x128")) {
    for (bool causal : {false, true}) {
      EXPECT_EQ(fp8_first(192, causal, 512, false), "128x128");
      EXPECT_EQ(fp8_first(192, causal, 1024, false), "128x128");
      EXPECT_EQ(fp8_first(192, causal, 1025, false), "128x160");
      EXPECT_EQ(fp8_first(192, causal, 16384, false), "128x160");
      EXPECT_EQ(fp8_first(192, causal, 16384, true), "128x128");
    }
    ++checked;
  }
  if (built(96, "192x128") && built(96, "128x128")) {
    for (bool causal : {false, true}) {
      EXPECT_EQ(fp8_first(96, causal, 512, false), "192x128");
      EXPECT_EQ(fp8_first(96, causal, 16384, false), "192x128");
      EXPECT_EQ(fp8_first(96, causal, 16384, true), "128x128");
    }
    ++checked;
  }
  if (built(256, "128x128") && built(256, "128x64")) {
    EXPECT_EQ(fp8_first(256, false, 512, false), "128x128");
    EXPECT_EQ(fp8_first(256, false, 16384, true), "128x128");
    EXPECT_EQ(fp8_first(256, true, 512, false), "128x64");
    EXPECT_EQ(fp8_first(256, true, 1024, true), "128x64");
    EXPECT_EQ(fp8_first(256, true, 1025, false), "128x128");
    EXPECT_EQ(fp8_first(256, true, 16384, false), "128x128");
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "FP8 head dims 96, 192 and 256 do not have both of their tiles in this build";
}

TEST(FwdDispatch, Fp8BlockScalesRunOnTilesWhoseBlocksDivideTheirRows) {
  const auto entry = [](int block_m, int block_n) {
    FwdKernelEntry k{};
    k.tile = {block_m, block_n};
    return k;
  };
  EXPECT_TRUE(entry(128, 128).takes_fp8_block_scales());
  EXPECT_TRUE(entry(128, 64).takes_fp8_block_scales());
  EXPECT_FALSE(entry(128, 224).takes_fp8_block_scales());
  EXPECT_FALSE(entry(128, 192).takes_fp8_block_scales());
  EXPECT_FALSE(entry(192, 128).takes_fp8_block_scales());
  int fp8_kernels = 0;
  for (const FwdKernelEntry& k : fwd_kernels()) {
    if (k.dtype != DType::kFloat8E4M3) continue;
    ++fp8_kernels;
    SCOPED_TRACE(testing::Message() << "hdim " << k.head_dim << " " << k.name());
    Problem p = problem(k.head_dim, k.mask == MaskKind::kCausal, 1000, 1000);
    const std::vector<const FwdKernelEntry*> any = fwd_candidates(p, DType::kFloat8E4M3, k.out_dtype);
    EXPECT_NE(std::find(any.begin(), any.end(), &k), any.end()) << "a call without block scales may take any tile";
    p.fp8_block_scales = true;
    const std::vector<const FwdKernelEntry*> scaled = fwd_candidates(p, DType::kFloat8E4M3, k.out_dtype);
    for (const FwdKernelEntry* e : scaled) EXPECT_TRUE(e->takes_fp8_block_scales()) << e->name();
    EXPECT_EQ(std::find(scaled.begin(), scaled.end(), &k) != scaled.end(), k.takes_fp8_block_scales());
  }
  if (fp8_kernels == 0) GTEST_SKIP() << "no FP8 kernels built (FA3_GPU_FP8)";
}

}  // namespace
}  // namespace fa3::hopper
