// The Hopper forward kernel against the CUDA reference: the accuracy rule over the
// shape list of TESTING.md, and the guards (unwritten output, out-of-bounds reads,
// determinism, races, 64-bit offsets, rejected pointers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/fa3.h"
#include "hopper/fwd_dispatch.h"

namespace fa3::test {
namespace {

struct Inputs {
  PaddedTensor q, k, v, out, lse;
  ForwardArgs args;
};

// `dv`: V's (and O's) head dim, when it is not `d`.
Inputs make_inputs(DType dtype, const Shape& s, std::int64_t d, bool causal, std::uint64_t seed,
                   std::int64_t pad = 0, std::int64_t row_pad = 0, std::int64_t margin = 0, std::int64_t dv = 0) {
  dv = dv > 0 ? dv : d;
  Inputs in;
  in.q = make_tensor(dtype, s.batch, s.seqlen_q, s.nheads_q, d, seed + 1, pad, row_pad, margin);
  in.k = make_tensor(dtype, s.batch, s.seqlen_k, s.nheads_kv, d, seed + 2, pad, row_pad, margin);
  in.v = make_tensor(dtype, s.batch, s.seqlen_k, s.nheads_kv, dv, seed + 3, pad, row_pad, margin);
  in.out = make_tensor(dtype, s.batch, s.seqlen_q, s.nheads_q, dv, seed + 4, pad, row_pad, margin);
  // lse as a 3-d view (batch, heads, seqlen) inside a padded 4-d allocation.
  in.lse = make_tensor(DType::kFloat32, s.batch, s.nheads_q, s.seqlen_q, 1, seed + 5, 0, row_pad, margin);
  TensorView lse = in.lse.view;
  lse.rank = 3;
  in.args.q = in.q.view;
  in.args.k = in.k.view;
  in.args.v = in.v.view;
  in.args.out = in.out.view;
  in.args.lse = lse;
  in.args.options.causal = causal;
  return in;
}

std::vector<DType> built_dtypes() {
  std::vector<DType> out;
  for (const std::string& name : build_info().dtypes) out.push_back(name == "fp16" ? DType::kFloat16 : DType::kBFloat16);
  return out;
}

class FwdAccuracy : public ::testing::TestWithParam<std::tuple<DType, int, bool>> {};

TEST_P(FwdAccuracy, MatchesReferenceOverShapeList) {
  FA3_REQUIRE_HOPPER();
  const auto [dtype, d, causal] = GetParam();
  std::uint64_t seed = 1000 * static_cast<std::uint64_t>(d) + (causal ? 7 : 0);
  for (const Shape& s : accuracy_shapes()) {
    SCOPED_TRACE(testing::Message() << "batch " << s.batch << " sq " << s.seqlen_q << " sk " << s.seqlen_k
                                    << " heads " << s.nheads_q << ":" << s.nheads_kv);
    Inputs in = make_inputs(dtype, s, d, causal, seed += 17);
    // Every kernel built for the problem, not only the one forward() picks for it.
    for (const std::string& kernel : kernels_for(in.args)) {
      const AccuracyReport r = check_forward(in.args, kernel);
      EXPECT_TRUE(forward_accurate(r, dtype)) << "kernel " << kernel;
    }
  }
}

std::string accuracy_name(const ::testing::TestParamInfo<FwdAccuracy::ParamType>& info) {
  const auto [dtype, d, causal] = info.param;
  return std::string(dtype_name(dtype)) + "_hdim" + std::to_string(d) + (causal ? "_causal" : "_full");
}

// A build without GPU kernels instantiates none.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FwdAccuracy);
INSTANTIATE_TEST_SUITE_P(Built, FwdAccuracy,
                         ::testing::Combine(::testing::ValuesIn(built_dtypes()),
                                            ::testing::ValuesIn(build_info().head_dims), ::testing::Bool()),
                         accuracy_name);

// The accuracy rule for every kernel built for args' problem, which general_cases()
// send to the general family; false when that family was not built for it.
bool expect_general_accurate(const ForwardArgs& args, DType dtype) {
  std::vector<std::string> kernels;
  const Status listed = forward_kernels(args, &kernels);
  EXPECT_TRUE(listed.is_ok()) << listed.to_string();
  for (const std::string& kernel : kernels) {
    EXPECT_TRUE(forward_accurate(check_forward(args, kernel), dtype)) << "kernel " << kernel;
  }
  return !kernels.empty();
}

// The general kernels (windows, chunks, softcap) under the same rule, for every case
// of general_cases() over the shape list.
class FwdGeneral : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(FwdGeneral, MatchesReferenceOverShapeList) {
  FA3_REQUIRE_HOPPER();
  const auto [dtype, d] = GetParam();
  std::uint64_t seed = 3000 * static_cast<std::uint64_t>(d);
  for (const GeneralCase& c : general_cases()) {
    for (const Shape& s : accuracy_shapes()) {
      SCOPED_TRACE(testing::Message() << c.name << ": batch " << s.batch << " sq " << s.seqlen_q << " sk " << s.seqlen_k
                                      << " heads " << s.nheads_q << ":" << s.nheads_kv);
      Inputs in = make_inputs(dtype, s, d, c.causal, seed += 17);
      in.args.options = c.options();
      if (!expect_general_accurate(in.args, dtype)) {
        GTEST_SKIP() << "no general kernel was built for " << dtype_name(dtype) << " hdim " << d;
      }
    }
  }
}

// Sinks (a logit per head in each row's denominator, fa3/attention.h) on every kernel
// family: out and lse against the reference, one head's sink -inf (none), with no mask
// and causal (the plain and causal kernels; rows without keys: lse is the sink) and a
// window with softcap (the general kernels).
TEST_P(FwdGeneral, SinksMatchReference) {
  FA3_REQUIRE_HOPPER();
  const auto [dtype, d] = GetParam();
  const float values[8] = {0.5f, -1.f, 2.5f, -30.f, 0.f, 1.5f, -INFINITY, 3.f};
  DeviceBuffer sinks(sizeof(values));
  FA3_CUDA_CHECK(cudaMemcpy(sinks.get(), values, sizeof(values), cudaMemcpyHostToDevice));
  const GeneralCase cases[] = {
      {"plain", false, -1, -1, 0.f}, {"causal", true, -1, 0, 0.f}, {"window_softcap", false, 100, 37, 5.f}};
  std::uint64_t seed = 7000 + static_cast<std::uint64_t>(d);
  for (const GeneralCase& c : cases) {
    for (const Shape& s : accuracy_shapes()) {
      SCOPED_TRACE(testing::Message() << "sinks, " << c.name << ": batch " << s.batch << " sq " << s.seqlen_q << " sk "
                                      << s.seqlen_k << " heads " << s.nheads_q << ":" << s.nheads_kv);
      Inputs in = make_inputs(dtype, s, d, c.causal, seed += 17);
      in.args.options = c.options();
      in.args.sinks = TensorView::contiguous(sinks.get(), DType::kFloat32, {s.nheads_q});
      if (!expect_general_accurate(in.args, dtype)) {
        GTEST_SKIP() << "no general kernel was built for " << dtype_name(dtype) << " hdim " << d;
      }
    }
  }
}

std::string general_name(const ::testing::TestParamInfo<FwdGeneral::ParamType>& info) {
  const auto [dtype, d] = info.param;
  return std::string(dtype_name(dtype)) + "_hdim" + std::to_string(d);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FwdGeneral);
INSTANTIATE_TEST_SUITE_P(Built, FwdGeneral,
                         ::testing::Combine(::testing::ValuesIn(built_dtypes()),
                                            ::testing::ValuesIn(build_info().head_dims)),
                         general_name);

// The head dims of the kernels built for equal Q/K and V head dims.
std::vector<int> equal_head_dims() {
  std::vector<int> out;
  for (const hopper::FwdKernelEntry& k : hopper::fwd_kernels()) {
    if (k.head_dim == k.head_dim_v && std::find(out.begin(), out.end(), k.head_dim) == out.end()) {
      out.push_back(k.head_dim);
    }
  }
  return out;
}

// Head dims no kernel was built for run on the next built one up, whose extra columns
// read as zeros: the accuracy rule over the shape list for every kernel of the plain
// and causal masks and a window with softcap, rows padded with NaN to whole 16-byte
// units (as TMA needs) and nothing past the head dim written.
class FwdAnyHeadDim : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(FwdAnyHeadDim, MatchesReferenceOverShapeList) {
  FA3_REQUIRE_HOPPER();
  const auto [dtype, d] = GetParam();
  std::uint64_t seed = 5000 * static_cast<std::uint64_t>(d);
  AttentionOptions causal, window_softcap;
  causal.causal = true;
  window_softcap.window_left = 100;
  window_softcap.window_right = 30;
  window_softcap.softcap = 5.f;
  for (const AttentionOptions& options : {AttentionOptions{}, causal, window_softcap}) {
    for (const Shape& s : accuracy_shapes()) {
      SCOPED_TRACE(testing::Message() << (options.causal ? "causal" : options.softcap > 0.f ? "window+softcap" : "full")
                                      << ": batch " << s.batch << " sq " << s.seqlen_q << " sk " << s.seqlen_k
                                      << " heads " << s.nheads_q << ":" << s.nheads_kv);
      Inputs in = make_inputs(dtype, s, d, options.causal, seed += 17, row_pad_for(d), 0, 256);
      in.args.options = options;
      for (const std::string& kernel : kernels_for(in.args)) {
        EXPECT_TRUE(forward_accurate(check_forward(in.args, kernel), dtype)) << "kernel " << kernel;
        EXPECT_EQ(written_outside_view(in.out), 0) << "kernel " << kernel << ": out written past its view";
      }
    }
  }
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FwdAnyHeadDim);
INSTANTIATE_TEST_SUITE_P(Built, FwdAnyHeadDim,
                         ::testing::Combine(::testing::ValuesIn(built_dtypes()),
                                            ::testing::ValuesIn(unbuilt_head_dims(equal_head_dims()))),
                         general_name);

// A V head dim of its own (DeepSeek-V3's (192, 128); (64, 256)), and smaller pairs that
// run on those kernels: the accuracy rule over the shape list for every kernel of the
// plain and causal masks and a window with softcap, nothing past O's head dim written.
TEST(FwdHeadDimV, MatchesReferenceOverShapeList) {
  FA3_REQUIRE_HOPPER();
  const std::pair<int, int> pairs[] = {{192, 128}, {144, 96}, {64, 256}, {40, 200}};
  AttentionOptions causal, window_softcap;
  causal.causal = true;
  window_softcap.window_left = 100;
  window_softcap.window_right = 30;
  window_softcap.softcap = 5.f;
  int ran = 0;
  std::uint64_t seed = 11000;
  for (DType dtype : built_dtypes()) {
    for (const auto& [d, dv] : pairs) {
      const hopper::HeadDims kernel = hopper::fwd_kernel_head_dims(d, dv);
      if (kernel.qk == kernel.v) continue;  // no kernel of its own: the equal head dims' tests cover it
      ++ran;
      for (const AttentionOptions& options : {AttentionOptions{}, causal, window_softcap}) {
        for (const Shape& s : accuracy_shapes()) {
          SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " head dims " << d << ", " << dv << " on " << kernel.qk
                                          << "v" << kernel.v << (options.causal ? " causal" : "")
                                          << (options.softcap > 0.f ? " window+softcap" : "") << ": batch " << s.batch
                                          << " sq " << s.seqlen_q << " sk " << s.seqlen_k << " heads " << s.nheads_q
                                          << ":" << s.nheads_kv);
          Inputs in = make_inputs(dtype, s, d, options.causal, seed += 17, row_pad_for(d), 0, 256, dv);
          in.args.options = options;
          for (const std::string& kernel_name : kernels_for(in.args)) {
            EXPECT_TRUE(forward_accurate(check_forward(in.args, kernel_name), dtype)) << "kernel " << kernel_name;
            EXPECT_EQ(written_outside_view(in.out), 0) << "kernel " << kernel_name << ": out written past its view";
          }
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no kernel for a V head dim of its own was built";
}

// A V head dim wider than every built kernel's (DeepSeek's (64, 512); 300 and 320, whose
// last slice is narrower) runs in column slices of V and out: the accuracy rule over the
// shape list, plain, causal and window with softcap, lse included, nothing past out's
// head dim written; and a named kernel, which cannot take it whole, is refused by name.
TEST(FwdHeadDimV, WiderThanEveryKernelRunsInSlices) {
  FA3_REQUIRE_HOPPER();
  const int widest = hopper::fwd_widest_head_dim_v(false);
  AttentionOptions causal, window_softcap;
  causal.causal = true;
  window_softcap.window_left = 100;
  window_softcap.window_right = 30;
  window_softcap.softcap = 5.f;
  std::uint64_t seed = 12000;
  int ran = 0;
  for (DType dtype : built_dtypes()) {
    for (const auto& [d, dv] : {std::pair{64, 512}, std::pair{64, 296}, std::pair{128, 320}}) {
      if (dv <= widest || hopper::fwd_kernel_head_dims(d, 1).qk == 0) continue;
      ++ran;
      for (const AttentionOptions& options : {AttentionOptions{}, causal, window_softcap}) {
        for (const Shape& s : accuracy_shapes()) {
          SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " head dims " << d << ", " << dv
                                          << (options.causal ? " causal" : "")
                                          << (options.softcap > 0.f ? " window+softcap" : "") << ": batch " << s.batch
                                          << " sq " << s.seqlen_q << " sk " << s.seqlen_k);
          Inputs in = make_inputs(dtype, s, d, options.causal, seed += 17, row_pad_for(d), 0, 256, dv);
          in.args.options = options;
          EXPECT_TRUE(forward_accurate(check_forward(in.args), dtype));
          EXPECT_EQ(written_outside_view(in.out), 0) << "out written past its view";
        }
      }
      Inputs in = make_inputs(dtype, Shape{1, 128, 128, 2, 2}, d, false, seed += 17, row_pad_for(d), 0, 256, dv);
      const Status named = forward_with_kernel(in.args, "any", nullptr);
      EXPECT_EQ(named.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(named.message().find("is wider than any kernel's"), std::string::npos) << named.message();
    }
  }
  if (ran == 0) GTEST_SKIP() << "every V head dim tried fits a built kernel, or no kernel takes q's";
}

// The accuracy rule for every built dtype, head dim, mask and kernel, on inputs whose
// key at position j is scaled by key_scale[j] and whose V is scaled by v_scale.
void expect_accurate_with_scaled_keys(const Shape& shape, const std::vector<float>& key_scale, float v_scale,
                                      std::uint64_t seed) {
  const std::vector<float> v_factors(static_cast<std::size_t>(shape.seqlen_k), v_scale);
  for (DType dtype : built_dtypes()) {
    for (int d : build_info().head_dims) {
      for (bool causal : {false, true}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " hdim " << d << (causal ? " causal" : ""));
        Inputs in = make_inputs(dtype, shape, d, causal, seed + d);
        scale_positions(in.k, key_scale);
        scale_positions(in.v, v_factors);
        for (const std::string& kernel : kernels_for(in.args)) {
          EXPECT_TRUE(forward_accurate(check_forward(in.args, kernel), dtype)) << "kernel " << kernel;
        }
      }
    }
  }
}

// Keys whose magnitude changes between groups of 64 positions, so that a row's max
// grows across key blocks by more than the softmax's lazy-rescale threshold (2^8: the
// reference moves and O is rescaled) and by less (the reference stays and
// probabilities exceed 1). Keys are visited from the last block down: the last six
// groups are small, so every row, causal or not, starts small and meets the large
// groups later. Scales stay <= 3 so that the scores keep the spread the accuracy
// rule's absolute cap was set for.
TEST(FwdNumerics, ScoresJumpingBetweenKeyBlocks) {
  FA3_REQUIRE_HOPPER();
  const float group_scale[16] = {1.f,  2.5f,  0.25f, 1.5f,  1.f,   3.f,   0.5f,  2.f,
                                 3.f,  1.f,   0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
  const Shape shape{2, 300, 1000, 4, 2};
  std::vector<float> key_scale(static_cast<std::size_t>(shape.seqlen_k));
  for (std::size_t j = 0; j < key_scale.size(); ++j) key_scale[j] = group_scale[j / 64];
  expect_accurate_with_scaled_keys(shape, key_scale, 1.f, 31);
}

// The same visiting order with one group of keys scaled by 100: scores jump by far
// more than fp32's exponent range (2^128), so a reference that failed to move would
// overflow P and the row sums. V is zero, which makes O exactly 0 whatever the scores
// (inf or NaN would show) and leaves the LSE to check the statistics.
TEST(FwdNumerics, ScoreJumpBeyondFp32Range) {
  FA3_REQUIRE_HOPPER();
  const Shape shape{2, 300, 1000, 4, 2};
  std::vector<float> key_scale(static_cast<std::size_t>(shape.seqlen_k), 0.25f);
  for (std::size_t j = 512; j < 576; ++j) key_scale[j] = 100.f;
  expect_accurate_with_scaled_keys(shape, key_scale, 0.f, 53);
}

DType first_dtype() { return built_dtypes().front(); }
int mid_head_dim() {
  const auto& dims = build_info().head_dims;
  return dims[dims.size() / 2];
}

// Bytes of a device buffer, for bitwise comparisons.
std::vector<std::uint8_t> bytes_of(const PaddedTensor& t) { return t.buffer.to_host(); }

TEST(FwdGuards, PaddingAndMarginsNeverReadOrWritten) {
  FA3_REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    const Shape s{2, 301, 517, 6, 2};
    const int d = mid_head_dim();
    // Same values, laid out densely and with NaN padding (8 elements per row, 5 rows
    // per batch) and a NaN margin after each buffer.
    Inputs dense = make_inputs(first_dtype(), s, d, causal, 42);
    Inputs padded = make_inputs(first_dtype(), s, d, causal, 42, 8, 5, 4096);
    for (auto* t : {&padded.q, &padded.k, &padded.v}) {
      const TensorView& src = (t == &padded.q ? dense.q : t == &padded.k ? dense.k : dense.v).view;
      const std::size_t row_bytes = static_cast<std::size_t>(d) * dtype_size(src.dtype);
      for (std::int64_t b = 0; b < s.batch; ++b) {
        const std::int64_t rows = src.shape[1] * src.shape[2];
        const char* from = static_cast<const char*>(src.data) + b * src.stride[0] * dtype_size(src.dtype);
        char* to = static_cast<char*>(t->view.data) + b * t->view.stride[0] * dtype_size(src.dtype);
        FA3_CUDA_CHECK(cudaMemcpy2D(to, static_cast<std::size_t>(t->view.stride[2]) * dtype_size(src.dtype), from,
                                    row_bytes, row_bytes, static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice));
      }
    }
    for (const std::string& kernel : kernels_for(padded.args)) {
      SCOPED_TRACE("kernel " + kernel);
      const AccuracyReport r = check_forward(padded.args, kernel);
      EXPECT_TRUE(forward_accurate(r, first_dtype()));
      ASSERT_TRUE(forward_with_kernel(dense.args, kernel, nullptr).is_ok());
      FA3_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(dense_host(dense.args.out), dense_host(padded.args.out)) << "padding changed the result";

      // Every padding element and the margin of out still hold NaN.
      EXPECT_EQ(written_outside_view(padded.out), 0) << "elements outside out's view were written";
    }
  }
}

TEST(FwdGuards, BitwiseDeterministicOverManyRuns) {
  FA3_REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Inputs in = make_inputs(first_dtype(), {2, 1000, 1000, 8, 2}, mid_head_dim(), causal, 7);
    ASSERT_TRUE(forward(in.args, nullptr).is_ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    const auto first_out = bytes_of(in.out), first_lse = bytes_of(in.lse);
    // Hundreds of repetitions: a missing barrier shows up as an occasional difference.
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(forward(in.args, nullptr).is_ok());
      if (i % 50 == 49) {
        FA3_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_EQ(bytes_of(in.out), first_out) << "run " << i;
        ASSERT_EQ(bytes_of(in.lse), first_lse) << "run " << i;
      }
    }
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(bytes_of(in.out), first_out);
  }
}

// sm_margin leaves SMs free: the persistent grid shrinks (to one CTA at the largest
// margin), each CTA runs more tiles, and the result is bitwise the full grid's.
TEST(FwdGuards, SmMarginGivesTheSameBytes) {
  FA3_REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Inputs in = make_inputs(first_dtype(), {2, 1000, 1000, 8, 2}, mid_head_dim(), causal, 8);
    ASSERT_TRUE(forward(in.args, nullptr).is_ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    const auto want_out = bytes_of(in.out), want_lse = bytes_of(in.lse);
    for (const int margin : {8, 100, 100000}) {
      ForwardArgs a = in.args;
      a.options.sm_margin = margin;
      ASSERT_TRUE(forward(a, nullptr).is_ok());
      FA3_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(bytes_of(in.out), want_out) << "sm_margin " << margin << (causal ? " causal" : "");
      EXPECT_EQ(bytes_of(in.lse), want_lse) << "sm_margin " << margin << (causal ? " causal" : "");
    }
  }
}

// Several tiles per CTA for every dtype, head dim and kernel, so that each reuses the
// Q stages, K/V stages and O buffer of the tiles before it. Causal, tiles of every
// length follow one another, and so do tiles without keys (more queries than keys:
// the first 400 rows see none). Non-causal, 300 queries make an odd number of
// 128-row query blocks per head, so that the CTA pairs sharing K/V loads
// (FwdConfig::cluster_m) pair each head's last block with one past the sequence end.
TEST(FwdGuards, MoreTilesThanSms) {
  FA3_REQUIRE_HOPPER();
  for (const DType dtype : built_dtypes()) {
    for (const int d : build_info().head_dims) {
      for (bool causal : {false, true}) {
        for (const Shape& shape : {Shape{40, 700, 300, 2, 1}, Shape{40, 300, 700, 2, 1}}) {
          SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " hdim " << d << (causal ? " causal" : "")
                                          << " sq " << shape.seqlen_q);
          Inputs in = make_inputs(dtype, shape, d, causal, 11);
          for (const std::string& kernel : kernels_for(in.args)) {
            EXPECT_TRUE(forward_accurate(check_forward(in.args, kernel), dtype)) << "kernel " << kernel;
          }
        }
      }
    }
  }
}

// Causal launches take tiles from a counter kept per stream (hopper/tile_counter.h).
// Two streams run launches of two sizes in turns at the same time, each output poisoned
// with NaN in stream order first: a counter shared between the streams, or one not
// back at zero, would skip or repeat tiles and leave NaN or a wrong result.
TEST(FwdGuards, CausalLaunchesOnTwoStreamsAtOnce) {
  FA3_REQUIRE_HOPPER();
  const DType dtype = first_dtype();
  const int d = mid_head_dim();
  const Shape shapes[2] = {{4, 1000, 1000, 8, 2}, {2, 2100, 2100, 8, 2}};
  std::vector<Inputs> in;
  std::vector<std::vector<std::uint8_t>> expected;
  for (int i = 0; i < 4; ++i) {
    in.push_back(make_inputs(dtype, shapes[i % 2], d, true, 41 + i % 2));
    if (i < 2) {
      EXPECT_TRUE(forward_accurate(check_forward(in.back().args), dtype));
      expected.push_back(bytes_of(in.back().out));
    }
  }
  cudaStream_t streams[2];
  for (cudaStream_t& s : streams) FA3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  for (int round = 0; round < 20; ++round) {
    // Stream 0 runs inputs 0 and 1, stream 1 inputs 2 and 3, starting with the other size.
    for (int i : {0, 3, 1, 2}) {
      cudaStream_t s = streams[i / 2];
      FA3_CUDA_CHECK(cudaMemsetAsync(in[i].out.buffer.get(), 0xff, in[i].out.buffer.bytes(), s));
      ASSERT_TRUE(forward(in[i].args, s).is_ok());
    }
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 4; ++i) ASSERT_EQ(bytes_of(in[i].out), expected[i % 2]) << "round " << round << " input " << i;
  }
  for (cudaStream_t s : streams) FA3_CUDA_CHECK(cudaStreamDestroy(s));
}

// A forward captured into a CUDA graph in global capture mode, as inference engines
// capture, replays to the eager result for every kernel of the shape. The capture comes
// first, so that the paired kernels' one-time occupancy query (hopper/fwd_launch.cuh)
// runs while capturing; causal kernels draw tiles from a counter the graph owns.
TEST(FwdGuards, CapturedIntoCudaGraph) {
  FA3_REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Inputs in = make_inputs(first_dtype(), {1, 600, 4096, 4, 2}, mid_head_dim(), causal, 91);
    for (const std::string& kernel : kernels_for(in.args)) {
      SCOPED_TRACE(testing::Message() << (causal ? "causal " : "") << "kernel " << kernel);
      cudaStream_t s = nullptr;
      FA3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      fill_nan(in.args.out.data, in.args.out.dtype, span_elements(in.args.out));
      FA3_CUDA_CHECK(cudaDeviceSynchronize());
      cudaGraph_t graph = nullptr;
      FA3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      const Status captured = forward_with_kernel(in.args, kernel, s);
      FA3_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      ASSERT_TRUE(captured.is_ok()) << captured.message();
      cudaGraphExec_t exec = nullptr;
      FA3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < 2; ++i) FA3_CUDA_CHECK(cudaGraphLaunch(exec, s));
      FA3_CUDA_CHECK(cudaStreamSynchronize(s));
      const auto replayed = bytes_of(in.out);
      ASSERT_TRUE(forward_with_kernel(in.args, kernel, nullptr).is_ok());
      FA3_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(replayed, bytes_of(in.out));
      EXPECT_TRUE(forward_accurate(check_forward(in.args, kernel), first_dtype()));
      FA3_CUDA_CHECK(cudaGraphExecDestroy(exec));
      FA3_CUDA_CHECK(cudaGraphDestroy(graph));
      FA3_CUDA_CHECK(cudaStreamDestroy(s));
    }
  }
}

TEST(FwdGuards, OffsetsBeyond32Bits) {
  FA3_REQUIRE_HOPPER();
  // The second batch starts past element 2^31 of each buffer.
  const std::int64_t d = 64 <= mid_head_dim() ? mid_head_dim() : 64;
  const std::int64_t rows = 256, heads = 2;
  const std::int64_t row_pad = ((std::int64_t{1} << 31) / (heads * d)) + 8 - rows;
  Inputs in = make_inputs(first_dtype(), {2, rows, rows, heads, heads}, d, true, 5, 0, row_pad, 0);
  EXPECT_GT(in.args.q.stride[0], std::int64_t{1} << 31);
  EXPECT_TRUE(forward_accurate(check_forward(in.args), first_dtype()));
}

TEST(FwdGuards, HostPointersRejectedAndOutputUntouched) {
  FA3_REQUIRE_HOPPER();
  const std::int64_t d = mid_head_dim();
  std::vector<std::uint16_t> host(static_cast<std::size_t>(128 * 2 * d), 0x3c00);
  Inputs in = make_inputs(first_dtype(), {1, 128, 128, 2, 2}, d, false, 3);
  const auto before = bytes_of(in.out);
  ForwardArgs args = in.args;
  args.q.data = host.data();
  const Status st = forward(args, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("q: pointer is"), std::string::npos) << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(bytes_of(in.out), before);
}

// forward() runs the first kernel forward_kernels names; an unknown name is refused
// with the list of built ones, before anything is written.
TEST(FwdKernelChoice, DefaultIsFirstListedAndUnknownNamesRejected) {
  FA3_REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Inputs in = make_inputs(first_dtype(), {2, 300, 300, 4, 4}, mid_head_dim(), causal, 77);
    const std::vector<std::string> names = kernels_for(in.args);
    ASSERT_FALSE(names.empty());
    ASSERT_TRUE(forward(in.args, nullptr).is_ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> by_default = dense_host(in.args.out);
    ASSERT_TRUE(forward_with_kernel(in.args, names.front(), nullptr).is_ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(dense_host(in.args.out), by_default);

    fill_nan(in.args.out.data, in.args.out.dtype, span_elements(in.args.out));
    const Status st = forward_with_kernel(in.args, "7x7", nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("no forward kernel '7x7'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(names.front()), std::string::npos) << st.message();
    for (float x : dense_host(in.args.out)) ASSERT_TRUE(std::isnan(x));
  }
}

TEST(FwdGuards, UnsupportedHeadDimRejected) {
  FA3_REQUIRE_HOPPER();
  const auto& dims = build_info().head_dims;
  const int d = *std::max_element(dims.begin(), dims.end()) + 1;
  Inputs in = make_inputs(first_dtype(), {1, 64, 64, 2, 2}, d, false, 3);
  const auto before = bytes_of(in.out);
  const Status st = forward(in.args, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kNotSupported);
  EXPECT_NE(st.message().find("head dim " + std::to_string(d) + " is not supported"), std::string::npos)
      << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(bytes_of(in.out), before);
}

}  // namespace
}  // namespace fa3::test
