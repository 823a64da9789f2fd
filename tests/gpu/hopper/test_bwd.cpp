// The Hopper backward kernels against the CUDA reference: the accuracy rule for dq, dk
// and dv over the shape list of TESTING.md, and the guards (unwritten gradients,
// out-of-bounds reads and writes, strided views, rows without keys, determinism, races,
// 64-bit offsets, the workspace's rules and contents, rejected calls, CUDA graphs).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/fa3.h"
#include "hopper/bwd_dispatch.h"

namespace fa3::test {
namespace {

// Skips (reported as skipped) when the build holds no backward kernel.
#define FA3_REQUIRE_BACKWARD_KERNELS()                                                          \
  do {                                                                                          \
    if (::fa3::hopper::bwd_kernels().empty()) GTEST_SKIP() << "no backward kernels were built"; \
  } while (0)

// Where a tensor's elements live: `pad` NaN elements after each row of the head dim,
// `row_pad` NaN rows after each batch, a NaN `margin` after the buffer; or heads-major,
// a (batch, nheads, seqlen, head_dim) buffer viewed as (batch, seqlen, nheads, head_dim).
struct Layout {
  std::int64_t pad = 0, row_pad = 0, margin = 0;
  bool heads_major = false;
};
const Layout kDense{};
const Layout kPadded{8, 5, 4096, false};
const Layout kHeadsMajor{0, 0, 0, true};

PaddedTensor make_laid_out(const Layout& l, DType dtype, std::int64_t b, std::int64_t s, std::int64_t h,
                           std::int64_t d, std::uint64_t seed) {
  if (!l.heads_major) return make_tensor(dtype, b, s, h, d, seed, l.pad, l.row_pad, l.margin);
  PaddedTensor t = make_tensor(dtype, b, h, s, d, seed);
  t.view = TensorView::strided(t.buffer.get(), dtype, {b, s, h, d}, {h * s * d, d, s * d, 1});
  return t;
}

struct BwdInputs {
  PaddedTensor q, k, v, out, lse, dout, dq, dk, dv;
  DeviceBuffer workspace;
  BackwardArgs args;
};

// The tensors of a problem, random, with no out, lse or workspace computed yet; v, out
// and their gradients of head dim dv (0: d).
BwdInputs make_tensors(DType dtype, const Shape& s, std::int64_t d, bool causal, std::uint64_t seed,
                       const Layout& layout, std::int64_t dv = 0) {
  if (dv == 0) dv = d;
  BwdInputs in;
  in.q = make_laid_out(layout, dtype, s.batch, s.seqlen_q, s.nheads_q, d, seed + 1);
  in.k = make_laid_out(layout, dtype, s.batch, s.seqlen_k, s.nheads_kv, d, seed + 2);
  in.v = make_laid_out(layout, dtype, s.batch, s.seqlen_k, s.nheads_kv, dv, seed + 3);
  in.out = make_laid_out(layout, dtype, s.batch, s.seqlen_q, s.nheads_q, dv, seed + 4);
  in.dout = make_laid_out(layout, dtype, s.batch, s.seqlen_q, s.nheads_q, dv, seed + 5);
  in.dq = make_laid_out(layout, dtype, s.batch, s.seqlen_q, s.nheads_q, d, seed + 6);
  in.dk = make_laid_out(layout, dtype, s.batch, s.seqlen_k, s.nheads_kv, d, seed + 7);
  in.dv = make_laid_out(layout, dtype, s.batch, s.seqlen_k, s.nheads_kv, dv, seed + 8);
  // lse as a 3-d view (batch, heads, seqlen) inside a 4-d allocation padded like the rest.
  in.lse = make_tensor(DType::kFloat32, s.batch, s.nheads_q, s.seqlen_q, 1, seed + 9, 0, layout.row_pad, layout.margin);
  TensorView lse = in.lse.view;
  lse.rank = 3;
  in.args.q = in.q.view;
  in.args.k = in.k.view;
  in.args.v = in.v.view;
  in.args.out = in.out.view;
  in.args.dout = in.dout.view;
  in.args.lse = lse;
  in.args.dq = in.dq.view;
  in.args.dk = in.dk.view;
  in.args.dv = in.dv.view;
  in.args.options.causal = causal;
  return in;
}

// A workspace of exactly backward_workspace_size bytes for the arguments as they are.
void attach_workspace(BwdInputs& in) {
  std::size_t bytes = 0;
  const Status st = backward_workspace_size(in.args, &bytes);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  in.workspace = DeviceBuffer(bytes);
  in.args.workspace = in.workspace.get();
  in.args.workspace_bytes = bytes;
}

// Makes `in` ready to run: out and lse from fa3::forward with in.args.options, and a
// workspace for the chosen mode.
void prepare(BwdInputs& in, bool deterministic) {
  ForwardArgs fwd;
  fwd.q = in.args.q;
  fwd.k = in.args.k;
  fwd.v = in.args.v;
  fwd.out = in.args.out;
  fwd.lse = in.args.lse;
  fwd.sinks = in.args.sinks;
  fwd.options = in.args.options;
  const Status st = forward(fwd, nullptr);
  EXPECT_TRUE(st.is_ok()) << "forward: " << st.to_string();
  in.args.deterministic = deterministic;
  attach_workspace(in);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A backward problem ready to run: q, k, v and dout random (or copied from `values`),
// out and lse from fa3::forward, and a workspace for the chosen mode.
BwdInputs make_inputs(DType dtype, const Shape& s, std::int64_t d, bool causal, std::uint64_t seed,
                      bool deterministic = false, const Layout& layout = kDense, const BwdInputs* values = nullptr) {
  BwdInputs in = make_tensors(dtype, s, d, causal, seed, layout);
  if (values != nullptr) {
    copy_values(values->args.q, in.args.q);
    copy_values(values->args.k, in.args.k);
    copy_values(values->args.v, in.args.v);
    copy_values(values->args.dout, in.args.dout);
  }
  prepare(in, deterministic);
  return in;
}

bool built(DType dtype, int head_dim, hopper::MaskKind mask) {
  for (const hopper::BwdKernelEntry& k : hopper::bwd_kernels()) {
    if (k.dtype == dtype && k.head_dim == head_dim && k.mask == mask && !k.varlen) return true;
  }
  return false;
}
bool built(DType dtype, int head_dim, bool causal) {
  return built(dtype, head_dim, causal ? hopper::MaskKind::kCausal : hopper::MaskKind::kPlain);
}

// The kernels the guards run: the first built dtype at head dim 128 (else its middle
// built head dim), with whichever masks were built for them.
struct GuardConfig {
  DType dtype = DType::kBFloat16;
  int head_dim = 128;
  std::vector<bool> masks;
};

GuardConfig guard_config() {
  GuardConfig c;
  c.dtype = hopper::bwd_dtypes().front();
  std::vector<int> dims;
  for (const hopper::BwdKernelEntry& k : hopper::bwd_kernels()) {
    if (k.dtype == c.dtype) dims.push_back(k.head_dim);
  }
  std::sort(dims.begin(), dims.end());
  c.head_dim = std::find(dims.begin(), dims.end(), 128) != dims.end() ? 128 : dims[dims.size() / 2];
  for (bool causal : {false, true}) {
    if (built(c.dtype, c.head_dim, causal)) c.masks.push_back(causal);
  }
  return c;
}

std::vector<std::uint8_t> bytes_of(const PaddedTensor& t) { return t.buffer.to_host(); }

std::array<std::vector<std::uint8_t>, kGradients> gradient_bytes(const BwdInputs& in) {
  return {bytes_of(in.dq), bytes_of(in.dk), bytes_of(in.dv)};
}

void poison_gradients(const BackwardArgs& args) {
  for (const TensorView* g : gradient_views(args)) fill_nan(g->data, g->dtype, span_elements(*g));
}

// Runs the backward `runs` more times, the gradients poisoned before each, and expects
// dq, dk and dv bitwise the same as they are now (deterministic mode).
void expect_bitwise_over_repeats(BwdInputs& in, int runs) {
  const auto first = gradient_bytes(in);
  for (int run = 0; run < runs; ++run) {
    poison_gradients(in.args);
    ASSERT_TRUE(backward(in.args, nullptr).is_ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    const auto again = gradient_bytes(in);
    for (int g = 0; g < kGradients; ++g) ASSERT_EQ(again[g], first[g]) << kGradientNames[g] << ", run " << run;
  }
}

// One built plain or causal backward kernel family: what the accuracy test is
// parameterized by (the general ones have tests of their own).
struct Kernel {
  DType dtype;
  int head_dim;
  bool causal;
  std::string name() const {
    return std::string(dtype_name(dtype)) + "_hdim" + std::to_string(head_dim) + (causal ? "_causal" : "_full");
  }
};

void PrintTo(const Kernel& k, std::ostream* os) { *os << k.name(); }

std::vector<Kernel> built_kernels() {
  std::vector<Kernel> out;
  for (const hopper::BwdKernelEntry& k : hopper::bwd_kernels()) {
    if (k.mask != hopper::MaskKind::kGeneral && !k.varlen) {
      out.push_back({k.dtype, k.head_dim, k.mask == hopper::MaskKind::kCausal});
    }
  }
  return out;
}

class BwdAccuracy : public ::testing::TestWithParam<Kernel> {};

TEST_P(BwdAccuracy, MatchesReferenceOverShapeList) {
  FA3_REQUIRE_HOPPER();
  const Kernel& kernel = GetParam();
  std::uint64_t seed = 1000 * static_cast<std::uint64_t>(kernel.head_dim) + (kernel.causal ? 7 : 0);
  for (const Shape& s : accuracy_shapes()) {
    SCOPED_TRACE(testing::Message() << "batch " << s.batch << " sq " << s.seqlen_q << " sk " << s.seqlen_k
                                    << " heads " << s.nheads_q << ":" << s.nheads_kv);
    BwdInputs in = make_inputs(kernel.dtype, s, kernel.head_dim, kernel.causal, seed += 17);
    EXPECT_TRUE(backward_accurate(check_backward(in.args), kernel.dtype));
  }
}

// A build without backward kernels has no parameters, which is not an error.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BwdAccuracy);
INSTANTIATE_TEST_SUITE_P(Built, BwdAccuracy, ::testing::ValuesIn(built_kernels()),
                         [](const ::testing::TestParamInfo<Kernel>& info) { return info.param.name(); });

// Head dims no kernel was built for run on the next built one up: the accuracy rule
// over the shape list (MHA's dK/dV by TMA, GQA's through the accumulators), rows padded
// with NaN to whole 16-byte units, and nothing past the head dim read or written.
class BwdAnyHeadDim : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(BwdAnyHeadDim, MatchesReferenceOverShapeList) {
  FA3_REQUIRE_HOPPER();
  const auto [dtype, d] = GetParam();
  const int kernel_dim = hopper::bwd_kernel_head_dim(d);
  const Layout layout{row_pad_for(d), 0, 256, false};
  const GeneralCase cases[] = {
      {"full", false, -1, -1, 0.f}, {"causal", true, -1, 0, 0.f}, {"window_softcap", false, 100, 30, 5.f}};
  const hopper::MaskKind kinds[] = {hopper::MaskKind::kPlain, hopper::MaskKind::kCausal, hopper::MaskKind::kGeneral};
  std::uint64_t seed = 7000 * static_cast<std::uint64_t>(d);
  for (int i = 0; i < 3; ++i) {
    if (!built(dtype, kernel_dim, kinds[i])) continue;
    for (const Shape& s : accuracy_shapes()) {
      SCOPED_TRACE(testing::Message() << cases[i].name << ": batch " << s.batch << " sq " << s.seqlen_q << " sk "
                                      << s.seqlen_k << " heads " << s.nheads_q << ":" << s.nheads_kv);
      BwdInputs in = make_tensors(dtype, s, d, cases[i].causal, seed += 17, layout);
      in.args.options = cases[i].options();
      prepare(in, false);
      EXPECT_TRUE(backward_accurate(check_backward(in.args), dtype));
      EXPECT_EQ(written_outside_view(in.dq), 0) << "dq: elements outside the view were written";
      EXPECT_EQ(written_outside_view(in.dk), 0) << "dk: elements outside the view were written";
      EXPECT_EQ(written_outside_view(in.dv), 0) << "dv: elements outside the view were written";
    }
  }
}

std::string any_head_dim_name(const ::testing::TestParamInfo<BwdAnyHeadDim::ParamType>& info) {
  const auto [dtype, d] = info.param;
  return std::string(dtype_name(dtype)) + "_hdim" + std::to_string(d);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BwdAnyHeadDim);
INSTANTIATE_TEST_SUITE_P(Built, BwdAnyHeadDim,
                         ::testing::Combine(::testing::ValuesIn(hopper::bwd_dtypes()),
                                            ::testing::ValuesIn(unbuilt_head_dims(hopper::bwd_head_dims()))),
                         any_head_dim_name);

// A V head dim of its own (DeepSeek-V3's (192, 128); (64, 256); smaller pairs) runs on
// the kernel of the larger head dim: the accuracy rule over the shape list with the
// plain, causal and window+softcap kernels, rows padded with NaN to whole 16-byte units,
// nothing past a gradient's head dim written.
TEST(BwdHeadDimV, MatchesReferenceOverShapeList) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const std::pair<int, int> pairs[] = {{192, 128}, {128, 64}, {64, 256}, {40, 24}, {96, 192}};
  const GeneralCase cases[] = {
      {"full", false, -1, -1, 0.f}, {"causal", true, -1, 0, 0.f}, {"window_softcap", false, 100, 30, 5.f}};
  const hopper::MaskKind kinds[] = {hopper::MaskKind::kPlain, hopper::MaskKind::kCausal, hopper::MaskKind::kGeneral};
  int ran = 0;
  std::uint64_t seed = 13000;
  for (DType dtype : hopper::bwd_dtypes()) {
    for (const auto& [d, dv] : pairs) {
      const int kernel_dim = hopper::bwd_kernel_head_dim(std::max(d, dv));
      const Layout layout{std::max(row_pad_for(d), row_pad_for(dv)), 0, 256, false};
      for (int i = 0; i < 3; ++i) {
        if (kernel_dim == 0 || !built(dtype, kernel_dim, kinds[i])) continue;
        ++ran;
        for (const Shape& s : accuracy_shapes()) {
          SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " head dims " << d << ", " << dv << " on "
                                          << kernel_dim << " " << cases[i].name << ": batch " << s.batch << " sq "
                                          << s.seqlen_q << " sk " << s.seqlen_k << " heads " << s.nheads_q << ":"
                                          << s.nheads_kv);
          BwdInputs in = make_tensors(dtype, s, d, cases[i].causal, seed += 17, layout, dv);
          in.args.options = cases[i].options();
          prepare(in, false);
          EXPECT_TRUE(backward_accurate(check_backward(in.args), dtype));
          EXPECT_EQ(written_outside_view(in.dq), 0) << "dq: elements outside the view were written";
          EXPECT_EQ(written_outside_view(in.dk), 0) << "dk: elements outside the view were written";
          EXPECT_EQ(written_outside_view(in.dv), 0) << "dv: elements outside the view were written";
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no backward kernel fits any of the pairs";
}

// The general kernels (windows, chunks, softcap) for every case of general_cases() over
// the shape list; then, per case on one shape, deterministic mode bitwise the same over
// 100 repeats.
struct GeneralKernel {
  DType dtype;
  int head_dim;
  std::string name() const { return std::string(dtype_name(dtype)) + "_hdim" + std::to_string(head_dim); }
};
void PrintTo(const GeneralKernel& k, std::ostream* os) { *os << k.name(); }

std::vector<GeneralKernel> built_general_kernels() {
  std::vector<GeneralKernel> out;
  for (const hopper::BwdKernelEntry& k : hopper::bwd_kernels()) {
    if (k.mask == hopper::MaskKind::kGeneral && !k.varlen) out.push_back({k.dtype, k.head_dim});
  }
  return out;
}

class BwdGeneral : public ::testing::TestWithParam<GeneralKernel> {};

TEST_P(BwdGeneral, MatchesReferenceOverShapeList) {
  FA3_REQUIRE_HOPPER();
  const GeneralKernel& kernel = GetParam();
  std::uint64_t seed = 5000 * static_cast<std::uint64_t>(kernel.head_dim);
  for (const GeneralCase& c : general_cases()) {
    for (const Shape& s : accuracy_shapes()) {
      SCOPED_TRACE(testing::Message() << c.name << ": batch " << s.batch << " sq " << s.seqlen_q << " sk " << s.seqlen_k
                                      << " heads " << s.nheads_q << ":" << s.nheads_kv);
      BwdInputs in = make_tensors(kernel.dtype, s, kernel.head_dim, c.causal, seed += 17, kDense);
      in.args.options = c.options();
      prepare(in, false);
      EXPECT_TRUE(backward_accurate(check_backward(in.args), kernel.dtype));
    }
  }
}

TEST_P(BwdGeneral, DeterministicIsBitwiseRepeatable) {
  FA3_REQUIRE_HOPPER();
  const GeneralKernel& kernel = GetParam();
  for (const GeneralCase& c : general_cases()) {
    SCOPED_TRACE(c.name);
    BwdInputs in = make_tensors(kernel.dtype, {2, 600, 700, 8, 2}, kernel.head_dim, c.causal, 21, kDense);
    in.args.options = c.options();
    prepare(in, true);
    EXPECT_TRUE(backward_accurate(check_backward(in.args), kernel.dtype));
    expect_bitwise_over_repeats(in, 100);
  }
}

// Sinks on every kernel family (plain and causal cases run the plain and causal
// kernels): dq, dk, dv and the sinks' own gradient against the reference over the shape
// list, one head's sink -inf; dsinks bitwise the same twice.
TEST_P(BwdGeneral, SinksMatchReference) {
  FA3_REQUIRE_HOPPER();
  const GeneralKernel& kernel = GetParam();
  const float values[8] = {0.5f, -1.f, 2.5f, -30.f, 0.f, 1.5f, -INFINITY, 3.f};
  DeviceBuffer sinks(sizeof(values)), dsinks(sizeof(values));
  FA3_CUDA_CHECK(cudaMemcpy(sinks.get(), values, sizeof(values), cudaMemcpyHostToDevice));
  const GeneralCase cases[] = {
      {"plain", false, -1, -1, 0.f}, {"causal", true, -1, 0, 0.f}, {"window_softcap", false, 100, 37, 5.f}};
  std::uint64_t seed = 9000 + static_cast<std::uint64_t>(kernel.head_dim);
  for (const GeneralCase& c : cases) {
    for (const Shape& s : accuracy_shapes()) {
      SCOPED_TRACE(testing::Message() << "sinks, " << c.name << ": batch " << s.batch << " sq " << s.seqlen_q << " sk "
                                      << s.seqlen_k << " heads " << s.nheads_q << ":" << s.nheads_kv);
      BwdInputs in = make_tensors(kernel.dtype, s, kernel.head_dim, c.causal, seed += 17, kDense);
      in.args.options = c.options();
      in.args.sinks = TensorView::contiguous(sinks.get(), DType::kFloat32, {s.nheads_q});
      in.args.dsinks = TensorView::contiguous(dsinks.get(), DType::kFloat32, {s.nheads_q});
      prepare(in, false);
      EXPECT_TRUE(backward_accurate(check_backward(in.args), kernel.dtype));
      const std::vector<std::uint8_t> first = dsinks.to_host();
      ASSERT_TRUE(backward(in.args, nullptr).is_ok());
      FA3_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(dsinks.to_host(), first);
    }
  }
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BwdGeneral);
INSTANTIATE_TEST_SUITE_P(Built, BwdGeneral, ::testing::ValuesIn(built_general_kernels()),
                         [](const ::testing::TestParamInfo<GeneralKernel>& info) { return info.param.name(); });

// More query and key blocks than SMs for every kernel, so that each CTA of the
// persistent grid takes several tiles and reuses its buffers. With more queries than
// keys, causal, the first 400 rows see no key.
TEST(BwdGuards, MoreTilesThanSms) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  for (const Kernel& kernel : built_kernels()) {
    for (const Shape& shape : {Shape{40, 700, 300, 2, 1}, Shape{40, 300, 700, 2, 1}}) {
      SCOPED_TRACE(kernel.name() + " sq " + std::to_string(shape.seqlen_q));
      BwdInputs in = make_inputs(kernel.dtype, shape, kernel.head_dim, kernel.causal, 11);
      EXPECT_TRUE(backward_accurate(check_backward(in.args), kernel.dtype));
    }
  }
}

// sm_margin shrinks the backward's persistent grid; under the accuracy rule as before.
TEST(BwdGuards, SmMarginKeepsTheAccuracyRule) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const Kernel kernel = built_kernels().front();  // a copy: the vector is a temporary
  for (const int margin : {16, 100000}) {
    SCOPED_TRACE(kernel.name() + " sm_margin " + std::to_string(margin));
    BwdInputs in = make_inputs(kernel.dtype, Shape{4, 700, 900, 4, 2}, kernel.head_dim, kernel.causal, 12);
    in.args.options.sm_margin = margin;
    EXPECT_TRUE(backward_accurate(check_backward(in.args), kernel.dtype));
  }
}

// Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k query rows see no key
// (forward: out 0, lse -inf). Their dq is exactly zero, and nothing is NaN anywhere.
TEST(BwdGuards, RowsWithoutKeysGetZeroGradients) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  for (const Kernel& kernel : built_kernels()) {
    if (!kernel.causal) continue;
    SCOPED_TRACE(kernel.name());
    const Shape s{2, 700, 300, 4, 2};
    BwdInputs in = make_inputs(kernel.dtype, s, kernel.head_dim, true, 13);
    EXPECT_TRUE(backward_accurate(check_backward(in.args), kernel.dtype));
    const std::vector<float> dq = dense_host(in.args.dq);
    const std::int64_t row = s.nheads_q * kernel.head_dim;  // elements of one query position
    std::int64_t nonzero = 0;
    for (std::int64_t b = 0; b < s.batch; ++b) {
      for (std::int64_t i = 0; i < (s.seqlen_q - s.seqlen_k) * row; ++i) {
        if (dq[static_cast<std::size_t>(b * s.seqlen_q * row + i)] != 0.f) ++nonzero;
      }
    }
    EXPECT_EQ(nonzero, 0) << "dq of rows that see no key";
  }
}

// The same values laid out densely and with NaN padding and margins give bitwise the
// same gradients (deterministic mode, so that the sums' order is fixed), and nothing
// outside the gradients' views is written.
TEST(BwdGuards, PaddingAndMarginsNeverReadOrWritten) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const GuardConfig c = guard_config();
  for (bool causal : c.masks) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const Shape s{2, 301, 517, 6, 2};
    BwdInputs dense = make_inputs(c.dtype, s, c.head_dim, causal, 42, true);
    BwdInputs padded = make_inputs(c.dtype, s, c.head_dim, causal, 42, true, kPadded, &dense);
    EXPECT_TRUE(backward_accurate(check_backward(padded.args), c.dtype));
    ASSERT_TRUE(backward(dense.args, nullptr).is_ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    for (int g = 0; g < kGradients; ++g) {
      EXPECT_EQ(dense_host(*gradient_views(dense.args)[g]), dense_host(*gradient_views(padded.args)[g]))
          << kGradientNames[g] << ": padding changed the result";
    }
    EXPECT_EQ(written_outside_view(padded.dq), 0) << "dq: elements outside the view were written";
    EXPECT_EQ(written_outside_view(padded.dk), 0) << "dk: elements outside the view were written";
    EXPECT_EQ(written_outside_view(padded.dv), 0) << "dv: elements outside the view were written";
  }
}

// Every tensor heads-major, (batch, nheads, seqlen, head_dim) in memory: strides in
// another order than the usual layout's, the head dim still contiguous. Bitwise the
// dense layout's gradients in deterministic mode.
TEST(BwdGuards, HeadsMajorStridedViews) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const GuardConfig c = guard_config();
  for (bool causal : c.masks) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const Shape s{2, 333, 271, 8, 2};
    BwdInputs dense = make_inputs(c.dtype, s, c.head_dim, causal, 21, true);
    BwdInputs strided = make_inputs(c.dtype, s, c.head_dim, causal, 21, true, kHeadsMajor, &dense);
    EXPECT_TRUE(backward_accurate(check_backward(strided.args), c.dtype));
    ASSERT_TRUE(backward(dense.args, nullptr).is_ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    for (int g = 0; g < kGradients; ++g) {
      EXPECT_EQ(dense_host(*gradient_views(dense.args)[g]), dense_host(*gradient_views(strided.args)[g]))
          << kGradientNames[g] << ": the layout changed the result";
    }
  }
}

const Shape kMidMha{2, 1025, 1025, 8, 8};
const Shape kMidGqa{2, 1025, 1025, 8, 2};

// deterministic = true: dq, dk and dv bitwise identical over 100 repeats, each with the
// gradients poisoned first, MHA and GQA, causal and not.
TEST(BwdGuards, DeterministicModeBitwiseOverManyRuns) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const GuardConfig c = guard_config();
  for (const Shape& s : {kMidMha, kMidGqa}) {
    for (bool causal : c.masks) {
      SCOPED_TRACE(testing::Message() << "heads " << s.nheads_q << ":" << s.nheads_kv << (causal ? " causal" : ""));
      BwdInputs in = make_inputs(c.dtype, s, c.head_dim, causal, 7, true);
      EXPECT_TRUE(backward_accurate(check_backward(in.args), c.dtype));
      expect_bitwise_over_repeats(in, 100);
    }
  }
}

// Deterministic mode where its order has the most cases: masked query and key tails,
// many rounds of the grid with heads split between rounds, and a grid shrunk by
// sm_margin (non-causal tiles start at query blocks spread by round, hopper/bwd_dq_order.h).
// Under the accuracy rule, and bitwise the same over repeats.
TEST(BwdGuards, DeterministicOverTailsRoundsAndSmallGrids) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  for (const Kernel& kernel : built_kernels()) {
    for (const Shape& shape : {Shape{40, 700, 300, 2, 1}, Shape{40, 300, 700, 2, 1}, Shape{3, 1000, 1100, 5, 5}}) {
      for (const int margin : {0, 100}) {
        SCOPED_TRACE(kernel.name() + " sq " + std::to_string(shape.seqlen_q) + " sk " + std::to_string(shape.seqlen_k) +
                     " sm_margin " + std::to_string(margin));
        BwdInputs in = make_inputs(kernel.dtype, shape, kernel.head_dim, kernel.causal, 13, true);
        in.args.options.sm_margin = margin;
        EXPECT_TRUE(backward_accurate(check_backward(in.args), kernel.dtype));
        expect_bitwise_over_repeats(in, 3);
      }
    }
  }
}

// Default mode, repeated: within the rule every time (a race shows as an occasional
// stray value), and with MHA dk and dv bitwise identical, since only dq's partial sums
// from different key blocks meet in an unordered way there.
TEST(BwdGuards, DefaultModeRepeatedRuns) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const GuardConfig c = guard_config();
  for (const Shape& s : {kMidMha, kMidGqa}) {
    for (bool causal : c.masks) {
      SCOPED_TRACE(testing::Message() << "heads " << s.nheads_q << ":" << s.nheads_kv << (causal ? " causal" : ""));
      BwdInputs in = make_inputs(c.dtype, s, c.head_dim, causal, 9);
      const GradientReference ref = backward_reference(in.args);
      const bool mha = s.nheads_q == s.nheads_kv;
      std::array<std::vector<std::uint8_t>, kGradients> first;
      for (int run = 0; run < 100; ++run) {
        poison_gradients(in.args);
        ASSERT_TRUE(backward(in.args, nullptr).is_ok());
        FA3_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_TRUE(backward_accurate(compare_backward(in.args, ref), c.dtype)) << "run " << run;
        if (!mha) continue;
        const auto now = gradient_bytes(in);
        if (run == 0) first = now;
        ASSERT_EQ(now[1], first[1]) << "dk, run " << run;
        ASSERT_EQ(now[2], first[2]) << "dv, run " << run;
      }
    }
  }
}

TEST(BwdGuards, OffsetsBeyond32Bits) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const GuardConfig c = guard_config();
  // The second batch starts past element 2^31 of each buffer (lse included).
  const std::int64_t rows = 256, heads = 2;
  const std::int64_t row_pad = ((std::int64_t{1} << 31) / (heads * c.head_dim)) + 8 - rows;
  const Layout far{0, row_pad, 0, false};
  // Tensors of two such batches, 8 GiB each in 16 bits and 16 GiB in fp32: about 96 GiB
  // in all, more than an H100's 80 GB (where the allocations failed and the writes through
  // their null pointers broke every later test).
  const std::int64_t tensor_bytes = 2 * (rows + row_pad) * heads * c.head_dim * 2;
  FA3_REQUIRE_DEVICE_MEMORY(12 * tensor_bytes);
  BwdInputs in = make_inputs(c.dtype, {2, rows, rows, heads, heads}, c.head_dim, c.masks.back(), 5, false, far);
  EXPECT_GT(in.args.q.stride[0], std::int64_t{1} << 31);
  EXPECT_GT(in.args.dk.stride[0], std::int64_t{1} << 31);
  EXPECT_TRUE(backward_accurate(check_backward(in.args), c.dtype));
}

// Each workspace rule refuses the call with its message, before anything is written:
// the gradients and every workspace candidate keep their bytes.
TEST(BwdGuards, WorkspaceRulesRejectAndWriteNothing) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const GuardConfig c = guard_config();
  BwdInputs in = make_inputs(c.dtype, {1, 128, 128, 2, 2}, c.head_dim, c.masks.front(), 3);
  const std::size_t needed = in.args.workspace_bytes;
  const std::string n = std::to_string(needed);
  DeviceBuffer roomy(needed + 256);
  std::vector<std::uint8_t> host(needed + 256);
  void* host_aligned = host.data() + (256 - reinterpret_cast<std::uintptr_t>(host.data()) % 256) % 256;

  struct Case {
    const char* name;
    void* workspace;
    std::size_t bytes;
    std::string message;
  };
  const Case cases[] = {
      {"null", nullptr, needed, "workspace: data pointer is null; this call needs " + n +
                                    " bytes (fa3::backward_workspace_size)"},
      {"too small", in.workspace.get(), needed - 1,
       "workspace: " + std::to_string(needed - 1) + " bytes given, " + n + " needed (fa3::backward_workspace_size)"},
      {"misaligned", static_cast<char*>(roomy.get()) + 16, needed, "workspace: data pointer is not 256-byte aligned"},
      {"host memory", host_aligned, needed,
       "workspace: pointer is host memory, not memory of the current CUDA device"},
  };
  poison_gradients(in.args);
  FA3_CUDA_CHECK(cudaMemset(in.workspace.get(), 0x5a, needed));
  FA3_CUDA_CHECK(cudaMemset(roomy.get(), 0x5a, needed + 256));
  std::fill(host.begin(), host.end(), std::uint8_t{0x5a});
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  const auto gradients = gradient_bytes(in);
  const auto workspace = in.workspace.to_host(), roomy_before = roomy.to_host();
  const std::vector<std::uint8_t> host_before = host;

  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    BackwardArgs args = in.args;
    args.workspace = k.workspace;
    args.workspace_bytes = k.bytes;
    const Status st = backward(args, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), k.message);
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(gradient_bytes(in), gradients) << "gradients written by a rejected call";
    EXPECT_EQ(in.workspace.to_host(), workspace);
    EXPECT_EQ(roomy.to_host(), roomy_before);
    EXPECT_EQ(host, host_before);
  }
}

// What the workspace holds on entry does not matter: NaN bytes everywhere (in a buffer
// larger than needed) give bitwise the gradients of a zeroed one in deterministic mode,
// and gradients within the rule in default mode.
TEST(BwdGuards, WorkspaceContentsOnEntryDoNotMatter) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const GuardConfig c = guard_config();
  for (const Shape& s : {Shape{2, 517, 301, 4, 4}, Shape{2, 517, 301, 8, 2}}) {
    for (bool causal : c.masks) {
      for (bool deterministic : {true, false}) {
        SCOPED_TRACE(testing::Message() << "heads " << s.nheads_q << ":" << s.nheads_kv << (causal ? " causal" : "")
                                        << (deterministic ? " deterministic" : ""));
        BwdInputs in = make_inputs(c.dtype, s, c.head_dim, causal, 17, deterministic);
        DeviceBuffer garbage(in.args.workspace_bytes + 4096);
        FA3_CUDA_CHECK(cudaMemset(garbage.get(), 0xff, garbage.bytes()));
        BackwardArgs dirty = in.args;
        dirty.workspace = garbage.get();
        dirty.workspace_bytes = garbage.bytes();
        EXPECT_TRUE(backward_accurate(check_backward(dirty), c.dtype));
        if (!deterministic) continue;
        const auto from_garbage = gradient_bytes(in);
        FA3_CUDA_CHECK(cudaMemset(in.workspace.get(), 0, in.workspace.bytes()));
        ASSERT_TRUE(backward(in.args, nullptr).is_ok());
        FA3_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(gradient_bytes(in), from_garbage);
      }
    }
  }
}

// A backward captured into a CUDA graph (global capture mode) replays to the eager
// result: the call allocates nothing and keeps its scratch state in the workspace.
TEST(BwdGuards, CapturedIntoCudaGraph) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const GuardConfig c = guard_config();
  for (bool causal : c.masks) {
    SCOPED_TRACE(causal ? "causal" : "full");
    BwdInputs in = make_inputs(c.dtype, {1, 600, 2048, 8, 2}, c.head_dim, causal, 91, true);
    cudaStream_t stream = nullptr;
    FA3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    FA3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status captured = backward(in.args, stream);
    FA3_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(captured.is_ok()) << captured.to_string();
    cudaGraphExec_t exec = nullptr;
    FA3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    poison_gradients(in.args);
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 2; ++i) FA3_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    FA3_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto replayed = gradient_bytes(in);
    EXPECT_TRUE(backward_accurate(check_backward(in.args), c.dtype));
    EXPECT_EQ(gradient_bytes(in), replayed);
    FA3_CUDA_CHECK(cudaGraphExecDestroy(exec));
    FA3_CUDA_CHECK(cudaGraphDestroy(graph));
    FA3_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

// What the GPU backward does not do is refused with kNotSupported and its message,
// before anything is written.
TEST(BwdGuards, UnsupportedHeadDimRejected) {
  FA3_REQUIRE_HOPPER();
  FA3_REQUIRE_BACKWARD_KERNELS();
  const GuardConfig c = guard_config();
  struct Case {
    const char* name;
    std::int64_t head_dim;
    AttentionOptions options;
    std::string message;
  };
  std::string dims;
  for (int d : hopper::bwd_head_dims()) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  const int past = hopper::bwd_head_dims().back() + 1;
  const Case cases[] = {
      {"past the largest built head dim", past, {},
       "q: head dim " + std::to_string(past) + " is not supported; supported: 1 to " + std::to_string(past - 1) +
           " (kernels built for head dims " + dims + ")"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    BwdInputs in = make_tensors(c.dtype, {1, 64, 64, 2, 2}, k.head_dim, false, 3, kDense);
    in.args.options = k.options;
    DeviceBuffer workspace(1 << 20);
    in.args.workspace = workspace.get();
    in.args.workspace_bytes = workspace.bytes();
    poison_gradients(in.args);
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    const auto before = gradient_bytes(in);
    const Status st = backward(in.args, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kNotSupported) << st.to_string();
    EXPECT_EQ(st.message(), k.message);
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(gradient_bytes(in), before);
  }
}

}  // namespace
}  // namespace fa3::test
