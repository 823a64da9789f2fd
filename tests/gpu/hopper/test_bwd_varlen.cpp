// The Hopper backward kernels on variable-length (varlen) batches: each sequence's dq, dk
// and dv of a packed batch against the CUDA reference run on that sequence alone (the
// backward accuracy rule of TESTING.md per sequence), and dsinks against the sum of the
// sequences' references, over length mixes with 0, 1, odd lengths and block boundaries,
// seqused, plain, causal and windowed masks, MHA, GQA and MQA. out and lse come from the
// GPU varlen forward. Guards: the rows no sequence uses hold NaN in q, k, v, out and dout
// and must not reach any result; dq, dk and dv start as NaN and every row must be written
// (a sequence's with its gradient, the others with 0); a NaN margin after each gradient
// stays untouched; deterministic mode is bitwise equal over repeated calls. Head dims
// whose kernels do not carry the varlen paths must refuse the call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "api/validate.h"
#include "common/gpu_test_util.h"
#include "fa3/fa3.h"
#include "hopper/bwd_dispatch.h"
#include "hopper/fwd_dispatch.h"
#include "hopper/varlen_batch.h"
#include "reference/cuda_reference.h"
#include "reference/varlen.h"

namespace fa3::test {
namespace {

// Lengths 0, 1, odd ones and multiples of the backward's blocks (64 query rows, 128
// keys at head dim 128), on both sides, so that sequences start and end on and off block
// boundaries; keys empty with queries present (their dq 0); queries empty with keys
// present (their dk and dv 0); seqlen_q != seqlen_k both ways.
std::vector<Mix> mixes() {
  return {
      {"single_one", {{1, 1}}},
      {"boundaries", {{127, 127}, {128, 128}, {129, 129}, {64, 192}, {256, 80}, {3, 17}}},
      {"zero_lengths", {{0, 0}, {5, 0}, {0, 7}, {113, 239}, {0, 0}, {1, 1024}}},
      {"long_and_short", {{1025, 1023}, {1, 2}, {239, 113}, {2, 799}}},
      {"seqused", {{130, 140, 128, 129}, {17, 300, 0, 257}, {64, 64, 64, 0}, {200, 150, 177, 150}, {9, 9, 1, 9}}, true},
  };
}

// The packed batch of a mix on the device: q, k, v and dout random with NaN in every row
// no sequence uses (and kTailRows of them past the last sequence); out and lse from the
// GPU varlen forward; dq, dk, dv NaN, each with a NaN margin after it.
struct PackedBatch : VarlenIndex {
  static constexpr std::int64_t kMargin = 256;
  DType dtype;
  std::int64_t d, heads_q, heads_kv;
  DeviceBuffer q, k, v, out, lse, dout, dq, dk, dv, dsinks, sinks, workspace;
  BackwardArgs args;
  std::vector<std::uint8_t> dq_poison, dk_poison, dv_poison;

  PackedBatch(DType dt, std::int64_t head_dim, std::int64_t hq, std::int64_t hkv, const Mix& mix, std::uint64_t seed,
              const AttentionOptions& options, bool with_sinks, bool deterministic)
      : VarlenIndex(mix), dtype(dt), d(head_dim), heads_q(hq), heads_kv(hkv) {
    q = rows(total_q, heads_q);
    k = rows(total_k, heads_kv);
    v = rows(total_k, heads_kv);
    out = rows(total_q, heads_q);
    dout = rows(total_q, heads_q);
    dq = rows(total_q, heads_q);
    dk = rows(total_k, heads_kv);
    dv = rows(total_k, heads_kv);
    lse = DeviceBuffer(static_cast<std::size_t>(heads_q * total_q + kMargin) * sizeof(float));
    fill_normal(q.get(), dtype, total_q * heads_q * d, seed + 1);
    fill_normal(k.get(), dtype, total_k * heads_kv * d, seed + 2);
    fill_normal(v.get(), dtype, total_k * heads_kv * d, seed + 3);
    fill_normal(dout.get(), dtype, total_q * heads_q * d, seed + 4);
    poison_unused(q, dtype, d, cu_q, used_q, total_q, heads_q);
    poison_unused(k, dtype, d, cu_k, used_k, total_k, heads_kv);
    poison_unused(v, dtype, d, cu_k, used_k, total_k, heads_kv);
    poison_unused(dout, dtype, d, cu_q, used_q, total_q, heads_q);

    ForwardArgs fwd;
    fwd.q = view(q, total_q, heads_q);
    fwd.k = view(k, total_k, heads_kv);
    fwd.v = view(v, total_k, heads_kv);
    fwd.out = view(out, total_q, heads_q);
    fwd.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {heads_q, total_q});
    fwd.options = options;
    fwd.varlen = varlen;
    if (with_sinks) {
      sinks = sink_logits(heads_q);
      fwd.sinks = TensorView::contiguous(sinks.get(), DType::kFloat32, {heads_q});
    }
    const Status forward_status = forward(fwd, nullptr);
    EXPECT_TRUE(forward_status.is_ok()) << forward_status.to_string();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // out's rows of no sequence are 0 after the forward; NaN there must not reach dq.
    poison_unused(out, dtype, d, cu_q, used_q, total_q, heads_q);

    args.q = fwd.q;
    args.k = fwd.k;
    args.v = fwd.v;
    args.out = fwd.out;
    args.lse = fwd.lse;
    args.dout = view(dout, total_q, heads_q);
    args.dq = view(dq, total_q, heads_q);
    args.dk = view(dk, total_k, heads_kv);
    args.dv = view(dv, total_k, heads_kv);
    args.options = options;
    args.varlen = varlen;
    args.deterministic = deterministic;
    if (with_sinks) {
      args.sinks = fwd.sinks;
      dsinks = DeviceBuffer(static_cast<std::size_t>(heads_q) * sizeof(float));
      args.dsinks = TensorView::contiguous(dsinks.get(), DType::kFloat32, {heads_q});
    }
    std::size_t bytes = 0;
    const Status sized = backward_workspace_size(args, &bytes);
    EXPECT_TRUE(sized.is_ok()) << sized.to_string();
    workspace = DeviceBuffer(bytes);
    // Whatever the workspace holds on entry must not matter.
    fill_nan(workspace.get(), DType::kFloat32, static_cast<std::int64_t>(bytes / sizeof(float)));
    args.workspace = workspace.get();
    args.workspace_bytes = bytes;
    reset_gradients();
  }

  // NaN in dq, dk, dv (margins included) and dsinks; the bytes are kept to check the
  // margins with.
  void reset_gradients() {
    for (DeviceBuffer* b : {&dq, &dk, &dv}) fill_nan(b->get(), dtype, elements(*b));
    if (args.dsinks.defined()) fill_nan(dsinks.get(), DType::kFloat32, heads_q);
    dq_poison = dq.to_host();
    dk_poison = dk.to_host();
    dv_poison = dv.to_host();
  }

  DeviceBuffer rows(std::int64_t total, std::int64_t heads) const {
    return DeviceBuffer(static_cast<std::size_t>(total * heads * d + kMargin) * dtype_size(dtype));
  }
  std::int64_t elements(const DeviceBuffer& b) const {
    return static_cast<std::int64_t>(b.bytes() / dtype_size(dtype));
  }
  TensorView view(const DeviceBuffer& b, std::int64_t total, std::int64_t heads) const {
    return TensorView::contiguous(b.get(), dtype, {total, heads, d});
  }
  // Sequence s as a fixed-length backward call of batch 1 (views into the packed
  // tensors), without sinks' gradient (the call's sums over every sequence).
  BackwardArgs sequence_args(const reference::Sequence& s) const {
    BackwardArgs a;
    a.q = reference::rows_view(args.q, s.q_start, s.q_used);
    a.k = reference::rows_view(args.k, s.k_start, s.k_used);
    a.v = reference::rows_view(args.v, s.k_start, s.k_used);
    a.out = reference::rows_view(args.out, s.q_start, s.q_used);
    a.dout = reference::rows_view(args.dout, s.q_start, s.q_used);
    a.lse = reference::lse_view(args.lse, s.q_start, s.q_used);
    a.dq = reference::rows_view(args.dq, s.q_start, s.q_used);
    a.dk = reference::rows_view(args.dk, s.k_start, s.k_used);
    a.dv = reference::rows_view(args.dv, s.k_start, s.k_used);
    a.sinks = args.sinks;
    a.options = args.options;
    return a;
  }
};

Status run(const PackedBatch& b) {
  const Status st = backward(b.args, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return st;
}

void expect_zero(const TensorView& rows, const char* what) {
  for (float x : dense_host(rows)) ASSERT_EQ(x, 0.f) << what;
}

void expect_margin_untouched(const DeviceBuffer& b, const std::vector<std::uint8_t>& poison, std::size_t used,
                             const char* what) {
  const std::vector<std::uint8_t> now = b.to_host();
  EXPECT_EQ(std::vector<std::uint8_t>(now.begin() + static_cast<std::ptrdiff_t>(used), now.end()),
            std::vector<std::uint8_t>(poison.begin() + static_cast<std::ptrdiff_t>(used), poison.end()))
      << what << "'s margin was written";
}

// Checks every sequence's gradients against the reference on that sequence alone, the
// rows of no sequence for 0, dsinks against the sequences' summed references, and the
// margins for NaN.
void check_batch(const PackedBatch& b) {
  const std::vector<reference::Sequence> seqs = b.sequences();
  BackwardReport sinks_report;
  std::vector<float> dsinks_ref(static_cast<std::size_t>(b.heads_q), 0.f);
  std::vector<double> dsinks_own(static_cast<std::size_t>(b.heads_q), 0.0);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const reference::Sequence& s = seqs[i];
    SCOPED_TRACE(testing::Message() << "sequence " << i << " (q " << s.q_used << " of " << s.q_end - s.q_start
                                    << ", k " << s.k_used << " of " << s.k_end - s.k_start << ")");
    const BackwardArgs a = b.sequence_args(s);
    if (s.q_used == 0) {
      // No query: the sequence's keys get dk and dv 0.
      if (s.k_used > 0) {
        expect_zero(a.dk, "dk");
        expect_zero(a.dv, "dv");
      }
      continue;
    }
    if (s.k_used == 0) {
      expect_zero(a.dq, "dq");  // no key: dq 0
      continue;
    }
    BackwardArgs with_dsinks = a;
    DeviceBuffer seq_dsinks;
    if (b.args.sinks.defined()) {
      // The reference's dsinks of this sequence alone, added up over the sequences.
      seq_dsinks = DeviceBuffer(static_cast<std::size_t>(b.heads_q) * sizeof(float));
      with_dsinks.dsinks = TensorView::contiguous(seq_dsinks.get(), DType::kFloat32, {b.heads_q});
    }
    const GradientReference ref = backward_reference(with_dsinks);
    const BackwardReport r = compare_backward(a, ref);
    EXPECT_TRUE(backward_accurate(r, b.dtype)) << r.summary();
    if (b.args.sinks.defined()) {
      for (std::size_t h = 0; h < dsinks_ref.size(); ++h) dsinks_ref[h] += ref.dsinks_ref[h];
      // The formula on this call's out and lse, in double.
      const std::vector<float> out = dense_host(a.out), dout = dense_host(a.dout), lse = dense_host(a.lse);
      const std::vector<float> sinks = floats_of(b.sinks);
      for (std::int64_t h = 0; h < b.heads_q; ++h) {
        const double sink = sinks[static_cast<std::size_t>(h)];
        for (std::int64_t row = 0; sink != -INFINITY && row < s.q_used; ++row) {
          double dd = 0;
          const std::size_t at = static_cast<std::size_t>((row * b.heads_q + h) * b.d);
          for (std::int64_t e = 0; e < b.d; ++e) dd += static_cast<double>(out[at + e]) * dout[at + e];
          const double row_lse = lse[static_cast<std::size_t>(h * s.q_used + row)];
          dsinks_own[static_cast<std::size_t>(h)] -= std::exp(sink - row_lse) * dd;
        }
      }
    }
  }
  if (b.args.sinks.defined()) {
    const std::vector<float> got = floats_of(b.dsinks);
    std::vector<float> own(dsinks_own.begin(), dsinks_own.end());
    sinks_report.has_dsinks = true;
    sinks_report.dsinks_err = max_abs_diff(got, dsinks_ref);
    for (float x : dsinks_ref) sinks_report.dsinks_max = std::max<double>(sinks_report.dsinks_max, std::fabs(x));
    sinks_report.dsinks_own_err = max_abs_diff(got, own);
    for (float x : own) sinks_report.dsinks_own_max = std::max<double>(sinks_report.dsinks_own_max, std::fabs(x));
    EXPECT_TRUE(backward_accurate(sinks_report, b.dtype)) << "dsinks: " << sinks_report.summary();
  }
  // Rows of no sequence: dq 0; keys of none: dk and dv 0.
  for (const reference::RowRange& r : reference::unused_query_rows(seqs, b.total_q)) {
    SCOPED_TRACE(testing::Message() << "unused query rows [" << r.begin << ", " << r.end << ")");
    expect_zero(reference::rows_view(b.args.dq, r.begin, r.end - r.begin), "dq");
  }
  for (const reference::RowRange& r : reference::unused_key_rows(seqs, b.total_k)) {
    SCOPED_TRACE(testing::Message() << "unused key rows [" << r.begin << ", " << r.end << ")");
    expect_zero(reference::rows_view(b.args.dk, r.begin, r.end - r.begin), "dk");
    expect_zero(reference::rows_view(b.args.dv, r.begin, r.end - r.begin), "dv");
  }
  const std::size_t bytes = dtype_size(b.dtype);
  expect_margin_untouched(b.dq, b.dq_poison, static_cast<std::size_t>(b.total_q * b.heads_q * b.d) * bytes, "dq");
  expect_margin_untouched(b.dk, b.dk_poison, static_cast<std::size_t>(b.total_k * b.heads_kv * b.d) * bytes, "dk");
  expect_margin_untouched(b.dv, b.dv_poison, static_cast<std::size_t>(b.total_k * b.heads_kv * b.d) * bytes, "dv");
}

std::vector<DType> built_dtypes() {
  std::vector<DType> out;
  for (DType dtype : hopper::bwd_dtypes()) out.push_back(dtype);
  return out;
}

// The head dims whose kernels run varlen calls, and the others (refused).
std::vector<int> head_dims(bool runs) {
  std::vector<int> out;
  for (int d : hopper::bwd_head_dims()) {
    if (hopper::bwd_runs_varlen(d) == runs) out.push_back(d);
  }
  return out;
}

struct VarlenCase {
  const char* name;
  AttentionOptions options;
  bool sinks = false;
};

// Plain, causal and a window (the general family), and sinks.
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
  cases.push_back({"causal_sinks", causal, true});
  return cases;
}

bool switched_on() { return hopper::bwd_varlen_enabled() && hopper::fwd_varlen_enabled(); }

class BwdVarlen : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(BwdVarlen, EverySequenceMatchesItsOwnReference) {
  FA3_REQUIRE_HOPPER();
  if (!switched_on()) GTEST_SKIP() << "the GPU varlen backward is switched off (FA3_GPU_VARLEN)";
  const auto [dtype, d] = GetParam();
  std::uint64_t seed = 9000 + static_cast<std::uint64_t>(d);
  // MHA, GQA 8:2 and MQA 8:1 in turn.
  const std::int64_t heads[][2] = {{2, 2}, {8, 2}, {8, 1}};
  int layout = 0;
  for (const VarlenCase& c : varlen_cases()) {
    for (const Mix& mix : mixes()) {
      for (bool deterministic : {false, true}) {
        const std::int64_t* h = heads[layout++ % 3];
        SCOPED_TRACE(testing::Message() << c.name << ", mix " << mix.name << ", heads " << h[0] << ":" << h[1]
                                        << (deterministic ? ", deterministic" : ""));
        PackedBatch b(dtype, d, h[0], h[1], mix, seed += 31, c.options, c.sinks, deterministic);
        const Status st = run(b);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        check_batch(b);
      }
    }
  }
}

TEST_P(BwdVarlen, DeterministicRepeatsAreBitwiseEqual) {
  FA3_REQUIRE_HOPPER();
  if (!switched_on()) GTEST_SKIP() << "the GPU varlen backward is switched off (FA3_GPU_VARLEN)";
  const auto [dtype, d] = GetParam();
  AttentionOptions causal;
  causal.causal = true;
  for (const std::int64_t hkv : {2, 8}) {
    SCOPED_TRACE(testing::Message() << "heads 8:" << hkv);
    PackedBatch b(dtype, d, 8, hkv, mixes()[3], 99 + static_cast<std::uint64_t>(hkv), causal, true, true);
    ASSERT_TRUE(run(b).is_ok());
    const std::vector<std::uint8_t> dq = b.dq.to_host(), dk = b.dk.to_host(), dv = b.dv.to_host();
    const std::vector<std::uint8_t> dsinks = b.dsinks.to_host();
    for (int i = 0; i < 100; ++i) {
      b.reset_gradients();
      ASSERT_TRUE(run(b).is_ok());
      ASSERT_EQ(b.dq.to_host(), dq) << "run " << i;
      ASSERT_EQ(b.dk.to_host(), dk) << "run " << i;
      ASSERT_EQ(b.dv.to_host(), dv) << "run " << i;
      ASSERT_EQ(b.dsinks.to_host(), dsinks) << "run " << i;
    }
  }
}

std::string varlen_name(const ::testing::TestParamInfo<BwdVarlen::ParamType>& info) {
  const auto [dtype, d] = info.param;
  return std::string(dtype_name(dtype)) + "_hdim" + std::to_string(d);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BwdVarlen);
INSTANTIATE_TEST_SUITE_P(Built, BwdVarlen,
                         ::testing::Combine(::testing::ValuesIn(built_dtypes()), ::testing::ValuesIn(head_dims(true))),
                         varlen_name);

// Head dims whose kernels do not carry the varlen paths (and every head dim with the
// switch off) refuse a varlen call with kNotSupported naming cu_seqlens_q, and write
// nothing.
TEST(BwdVarlenRefused, OtherHeadDimsRefuse) {
  FA3_REQUIRE_HOPPER();
  if (!hopper::fwd_varlen_enabled()) GTEST_SKIP() << "out and lse need the GPU varlen forward (FA3_GPU_VARLEN)";
  std::vector<int> refused = head_dims(false);
  if (!hopper::bwd_varlen_enabled()) refused = hopper::bwd_head_dims();
  if (refused.empty() || built_dtypes().empty()) GTEST_SKIP() << "every built head dim runs varlen calls";
  const std::vector<int> forward_dims = hopper::fwd_head_dims();
  for (int d : refused) {
    if (std::find(forward_dims.begin(), forward_dims.end(), d) == forward_dims.end()) continue;
    SCOPED_TRACE(testing::Message() << "head dim " << d);
    PackedBatch b(built_dtypes().front(), d, 4, 2, mixes()[1], 5, {}, false, false);
    const std::vector<std::uint8_t> before = b.dq.to_host();
    const Status st = run(b);
    EXPECT_EQ(st.code(), StatusCode::kNotSupported) << st.to_string();
    EXPECT_NE(st.message().find("cu_seqlens_q"), std::string::npos) << st.to_string();
    EXPECT_EQ(b.dq.to_host(), before);
  }
}

}  // namespace
}  // namespace fa3::test
