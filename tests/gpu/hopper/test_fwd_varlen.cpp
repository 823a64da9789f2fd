// The Hopper forward kernels on variable-length (varlen) batches: each sequence of a
// packed batch against the CUDA reference run on that sequence alone (TESTING.md's
// accuracy rule on the whole output, judged sequence by sequence), over length mixes
// with 0, 1, odd lengths and block boundaries, seqused, causal with seqlen_q != seqlen_k
// per sequence, GQA and the general family's options, with every kernel built for the
// problem. Guards: the rows no sequence uses hold NaN in q, k and v and must not reach any
// result; out and lse start as NaN and every row must be written (a sequence's with its
// result, the others with 0 and -inf); a NaN margin after each output stays untouched;
// repeated calls are bitwise equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "api/validate.h"
#include "common/gpu_test_util.h"
#include "fa3/fa3.h"
#include "hopper/fwd_dispatch.h"
#include "hopper/varlen_batch.h"
#include "reference/cuda_reference.h"
#include "reference/varlen.h"

namespace fa3::test {
namespace {

// 70 sequences of 0 to 330 rows, some empty on either side: more than two warps' worth of
// sequences for the order that counts 32 of them at a time (hopper/varlen_tiles.cuh).
Mix many_sequences() {
  Mix mix{"many_sequences", {}};
  for (std::int32_t i = 0; i < 70; ++i) {
    mix.seqs.push_back({i % 7 == 3 ? 0 : 1 + i * 53 % 290, i % 11 == 5 ? 0 : 1 + i * 97 % 330});
  }
  return mix;
}

// Lengths 0, 1, odd ones and multiples of the tiles (64, 80, 128, 176 and 256 rows), on
// both sides, so that sequences start and end on and off block boundaries; keys empty
// with queries present; queries empty with keys present; seqlen_q != seqlen_k both ways.
std::vector<Mix> mixes() {
  return {
      {"single_one", {{1, 1}}},
      {"boundaries", {{127, 127}, {128, 128}, {129, 129}, {64, 192}, {256, 80}, {3, 17}}},
      {"zero_lengths", {{0, 0}, {5, 0}, {0, 7}, {113, 239}, {0, 0}, {1, 1024}}},
      {"long_and_short", {{1025, 1023}, {1, 2}, {239, 113}, {2, 799}}},
      {"seqused", {{130, 140, 128, 129}, {17, 300, 0, 257}, {64, 64, 64, 0}, {200, 150, 177, 150}, {9, 9, 1, 9}}, true},
      many_sequences(),
  };
}

// The packed batch of a mix on the device: q, k, v with NaN in every row no sequence
// uses (and `kTailRows` of them past the last sequence), out and lse NaN, each with a
// NaN margin after it.
struct PackedBatch : VarlenIndex {
  static constexpr std::int64_t kMargin = 256;
  DType dtype;
  std::int64_t d, heads_q, heads_kv;
  DeviceBuffer q, k, v, out, lse;
  DeviceBuffer sinks;
  ForwardArgs args;

  PackedBatch(DType dt, std::int64_t head_dim, std::int64_t hq, std::int64_t hkv, const Mix& mix, std::uint64_t seed,
              const AttentionOptions& options, bool with_sinks)
      : VarlenIndex(mix), dtype(dt), d(head_dim), heads_q(hq), heads_kv(hkv) {
    q = rows(total_q, heads_q);
    k = rows(total_k, heads_kv);
    v = rows(total_k, heads_kv);
    out = rows(total_q, heads_q);
    lse = DeviceBuffer(static_cast<std::size_t>(heads_q * total_q + kMargin) * sizeof(float));
    fill_normal(q.get(), dtype, total_q * heads_q * d, seed + 1);
    fill_normal(k.get(), dtype, total_k * heads_kv * d, seed + 2);
    fill_normal(v.get(), dtype, total_k * heads_kv * d, seed + 3);
    poison_unused(q, dtype, d, cu_q, used_q, total_q, heads_q);
    poison_unused(k, dtype, d, cu_k, used_k, total_k, heads_kv);
    poison_unused(v, dtype, d, cu_k, used_k, total_k, heads_kv);

    args.q = view(q, total_q, heads_q);
    args.k = view(k, total_k, heads_kv);
    args.v = view(v, total_k, heads_kv);
    args.out = view(out, total_q, heads_q);
    args.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {heads_q, total_q});
    args.options = options;
    args.varlen = varlen;
    if (with_sinks) {
      sinks = sink_logits(heads_q);
      args.sinks = TensorView::contiguous(sinks.get(), DType::kFloat32, {heads_q});
    }
    reset_outputs();
  }

  // NaN in out and lse, margins included; the bytes are kept to check the margins with.
  void reset_outputs() {
    fill_nan(out.get(), dtype, elements(out));
    fill_nan(lse.get(), DType::kFloat32, static_cast<std::int64_t>(lse.bytes() / sizeof(float)));
    out_poison = out.to_host();
    lse_poison = lse.to_host();
  }
  std::vector<std::uint8_t> out_poison, lse_poison;

  DeviceBuffer rows(std::int64_t total, std::int64_t heads) const {
    return DeviceBuffer(static_cast<std::size_t>(total * heads * d + kMargin) * dtype_size(dtype));
  }
  std::int64_t elements(const DeviceBuffer& b) const {
    return static_cast<std::int64_t>(b.bytes() / dtype_size(dtype));
  }
  TensorView view(const DeviceBuffer& b, std::int64_t total, std::int64_t heads) const {
    return TensorView::contiguous(b.get(), dtype, {total, heads, d});
  }
};

std::string sequence_trace(const std::string& kernel, std::size_t i, const reference::Sequence& s) {
  std::ostringstream m;
  m << "kernel " << kernel << ", sequence " << i << " (q " << s.q_used << " of " << s.q_end - s.q_start << ", k "
    << s.k_used << " of " << s.k_end - s.k_start << ")";
  return m.str();
}

// Runs the forward (the default kernel, or `kernel`) and waits for it.
Status run(const PackedBatch& b, const std::string& kernel) {
  const Status st = kernel.empty() ? forward(b.args, nullptr) : forward_with_kernel(b.args, kernel, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return st;
}

// Checks every sequence's rows against the reference on that sequence alone, the rows of
// no sequence for out 0 and lse -inf, and the margins for NaN.
//
// TESTING.md's rule bounds an output's error by its low reference's, and out and lse are
// the batch's: each sequence is held to the whole batch's low error, one at a time so that
// a failure names its sequence. A sequence's own low error is no bound for it: with a few
// rows, its largest elements are few, and where one lies just past a power of two (the
// output dtype's spacing doubles there) rounding alone decides the error. A 7-query
// sequence at head dim 192 (fp16) whose largest |out| is 1.044 errs there by 7.2e-4 in the
// kernel, whose fp32 value lies on the far side of a rounding midpoint by its fp16 weights'
// noise, and by 3.3e-4 in the low reference; its batch's low error is about 2e-3.
void check_batch(const PackedBatch& b, const std::string& kernel) {
  Problem whole;
  const Status valid = validate_forward(b.args, gpu_target(), &whole);
  ASSERT_TRUE(valid.is_ok()) << valid.to_string();
  const std::vector<reference::Sequence> seqs = b.sequences();
  std::vector<std::pair<std::size_t, AccuracyReport>> reports;
  double out_low_err = 0, lse_low_err = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const reference::Sequence& s = seqs[i];
    SCOPED_TRACE(sequence_trace(kernel, i, s));
    if (s.q_used == 0) continue;
    const TensorView out = reference::rows_view(b.args.out, s.q_start, s.q_used);
    const TensorView lse = reference::lse_view(b.args.lse, s.q_start, s.q_used);
    const std::vector<float> got_out = dense_host(out), got_lse = dense_host(lse);
    if (s.k_used == 0) {
      // No key: out 0, lse -inf (the sink's logit with sinks).
      for (float x : got_out) ASSERT_EQ(x, 0.f);
      std::vector<float> sinks(static_cast<std::size_t>(b.heads_q), -INFINITY);
      if (b.args.sinks.defined()) sinks = floats_of(b.sinks);
      for (std::size_t j = 0; j < got_lse.size(); ++j) {
        ASSERT_EQ(got_lse[j], sinks[j / static_cast<std::size_t>(s.q_used)]);
      }
      continue;
    }
    const Problem p = reference::sequence_problem(whole, s);
    const TensorView q = reference::rows_view(b.args.q, s.q_start, s.q_used);
    const TensorView k = reference::rows_view(b.args.k, s.k_start, s.k_used);
    const TensorView v = reference::rows_view(b.args.v, s.k_start, s.k_used);
    const std::size_t n_out = static_cast<std::size_t>(s.q_used * b.heads_q * b.d);
    const std::size_t n_lse = static_cast<std::size_t>(s.q_used * b.heads_q);
    DeviceBuffer ref_out(n_out * 4), ref_lse(n_lse * 4), low_out(n_out * 4), low_lse(n_lse * 4);
    const auto* sinks = static_cast<const float*>(b.args.sinks.data);
    ASSERT_TRUE(reference::cuda_forward(p, q, k, v, sinks, static_cast<float*>(ref_out.get()),
                                        static_cast<float*>(ref_lse.get()), reference::Precision::kExact, nullptr)
                    .is_ok());
    ASSERT_TRUE(reference::cuda_forward(p, q, k, v, sinks, static_cast<float*>(low_out.get()),
                                        static_cast<float*>(low_lse.get()), reference::Precision::kLikeInputs, nullptr)
                    .is_ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    AccuracyReport r;
    r.compare_out(got_out, floats_of(ref_out), floats_of(low_out));
    r.lse_err = max_abs_diff(got_lse, floats_of(ref_lse));
    r.lse_low_err = max_abs_diff(floats_of(low_lse), floats_of(ref_lse));
    out_low_err = std::max(out_low_err, r.out_low_err);
    lse_low_err = std::max(lse_low_err, r.lse_low_err);
    reports.emplace_back(i, r);
  }
  for (const auto& [i, own] : reports) {
    SCOPED_TRACE(sequence_trace(kernel, i, seqs[i]));
    AccuracyReport r = own;
    r.out_low_err = out_low_err;
    r.lse_low_err = lse_low_err;
    EXPECT_TRUE(forward_accurate(r, b.dtype))
        << r.summary() << "; the sequence's own low errors: out " << own.out_low_err << ", lse " << own.lse_low_err;
  }
  // Rows of no sequence: out 0, lse -inf.
  for (const reference::RowRange& r : reference::unused_query_rows(seqs, b.total_q)) {
    SCOPED_TRACE(testing::Message() << "kernel " << kernel << ", unused rows [" << r.begin << ", " << r.end << ")");
    for (float x : dense_host(reference::rows_view(b.args.out, r.begin, r.end - r.begin))) ASSERT_EQ(x, 0.f);
    for (float x : dense_host(reference::lse_view(b.args.lse, r.begin, r.end - r.begin))) ASSERT_EQ(x, -INFINITY);
  }
  // The margins after out and lse: never written.
  const std::vector<std::uint8_t> out_now = b.out.to_host(), lse_now = b.lse.to_host();
  const std::size_t out_used = static_cast<std::size_t>(b.total_q * b.heads_q * b.d) * dtype_size(b.dtype);
  const std::size_t lse_used = static_cast<std::size_t>(b.total_q * b.heads_q) * sizeof(float);
  EXPECT_EQ(std::vector<std::uint8_t>(out_now.begin() + out_used, out_now.end()),
            std::vector<std::uint8_t>(b.out_poison.begin() + out_used, b.out_poison.end()))
      << "out's margin was written";
  EXPECT_EQ(std::vector<std::uint8_t>(lse_now.begin() + lse_used, lse_now.end()),
            std::vector<std::uint8_t>(b.lse_poison.begin() + lse_used, b.lse_poison.end()))
      << "lse's margin was written";
}

std::vector<DType> built_dtypes() {
  std::vector<DType> out;
  for (const std::string& name : build_info().dtypes)
    out.push_back(name == "fp16" ? DType::kFloat16 : DType::kBFloat16);
  return out;
}

// Options of each family: plain, causal, and general ones (a window, the softcap, a
// chunk, sinks), which run on the three kernel families.
struct VarlenCase {
  const char* name;
  AttentionOptions options;
  bool sinks = false;
};

std::vector<VarlenCase> varlen_cases() {
  std::vector<VarlenCase> cases;
  cases.push_back({"plain", {}});
  AttentionOptions causal;
  causal.causal = true;
  cases.push_back({"causal", causal});
  AttentionOptions window;
  window.window_left = 100;
  window.window_right = 30;
  cases.push_back({"window", window});
  AttentionOptions capped;
  capped.causal = true;
  capped.softcap = 5.f;
  cases.push_back({"causal_softcap", capped});
  AttentionOptions chunk;
  chunk.attention_chunk = 96;
  cases.push_back({"chunk", chunk});
  cases.push_back({"sinks", {}, true});
  return cases;
}

class FwdVarlen : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(FwdVarlen, EverySequenceMatchesItsOwnReference) {
  FA3_REQUIRE_HOPPER();
  if (!hopper::fwd_varlen_enabled()) GTEST_SKIP() << "the GPU varlen forward is switched off (FA3_GPU_VARLEN)";
  const auto [dtype, d] = GetParam();
  std::uint64_t seed = 7000 + static_cast<std::uint64_t>(d);
  // MHA, GQA 8:2 and MQA 8:1 in turn.
  const std::int64_t heads[][2] = {{2, 2}, {8, 2}, {8, 1}};
  int layout = 0;
  for (const VarlenCase& c : varlen_cases()) {
    for (const Mix& mix : mixes()) {
      const std::int64_t* h = heads[layout++ % 3];
      SCOPED_TRACE(testing::Message() << c.name << ", mix " << mix.name << ", heads " << h[0] << ":" << h[1]);
      PackedBatch b(dtype, d, h[0], h[1], mix, seed += 31, c.options, c.sinks);
      std::vector<std::string> kernels;
      ASSERT_TRUE(forward_kernels(b.args, &kernels).is_ok());
      for (const std::string& kernel : kernels) {
        b.reset_outputs();
        const Status st = run(b, kernel);
        ASSERT_TRUE(st.is_ok()) << kernel << ": " << st.to_string();
        check_batch(b, kernel);
      }
    }
    ++layout;  // so that a mix meets another head layout in the next case, however many mixes there are
  }
}

TEST_P(FwdVarlen, RepeatedCallsAreBitwiseEqual) {
  FA3_REQUIRE_HOPPER();
  if (!hopper::fwd_varlen_enabled()) GTEST_SKIP() << "the GPU varlen forward is switched off (FA3_GPU_VARLEN)";
  const auto [dtype, d] = GetParam();
  AttentionOptions causal;
  causal.causal = true;
  const Mix mix = mixes()[3];
  PackedBatch b(dtype, d, 8, 2, mix, 99, causal, false);
  ASSERT_TRUE(run(b, "").is_ok());
  const std::vector<std::uint8_t> out = b.out.to_host(), lse = b.lse.to_host();
  for (int i = 0; i < 50; ++i) {
    b.reset_outputs();
    ASSERT_TRUE(run(b, "").is_ok());
    ASSERT_EQ(b.out.to_host(), out) << "run " << i;
    ASSERT_EQ(b.lse.to_host(), lse) << "run " << i;
  }
}

std::string varlen_name(const ::testing::TestParamInfo<FwdVarlen::ParamType>& info) {
  const auto [dtype, d] = info.param;
  return std::string(dtype_name(dtype)) + "_hdim" + std::to_string(d);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FwdVarlen);
INSTANTIATE_TEST_SUITE_P(Built, FwdVarlen,
                         ::testing::Combine(::testing::ValuesIn(built_dtypes()),
                                            ::testing::ValuesIn(hopper::fwd_head_dims())),
                         varlen_name);

// With the switch off the forward refuses a varlen call and writes nothing; the
// backward refuses it either way (no backward kernel reads cu_seqlens yet).
TEST(FwdVarlenSwitch, OffRefusesOnRuns) {
  FA3_REQUIRE_HOPPER();
  if (built_dtypes().empty() || hopper::fwd_head_dims().empty()) GTEST_SKIP() << "no forward kernels were built";
  PackedBatch b(built_dtypes().front(), hopper::fwd_head_dims().front(), 4, 2, mixes()[1], 5, {}, false);
  const std::vector<std::uint8_t> before = b.out.to_host();
  const Status st = run(b, "");
  if (hopper::fwd_varlen_enabled()) {
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  } else {
    EXPECT_EQ(st.code(), StatusCode::kNotSupported) << st.to_string();
    EXPECT_EQ(b.out.to_host(), before);
  }
}

}  // namespace
}  // namespace fa3::test
