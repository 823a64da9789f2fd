// The merge kernel (hopper/merge.cu) through its two entry points, against fa3::cpu's
// merges on the same values: fa3::merge_attention_states over random parts (rows no
// part saw, parts that saw none of a row's keys and hold NaN there), every output dtype,
// parts and result of different dtypes (fp32 with 16-bit, as ring attention merges),
// head dims that take one lane to a whole warp and more than one pass, strided and
// misaligned views (one value per access), out and lse on part 0's storage, 1 to 128
// parts, 64-bit offsets; fa3::combine over 1 to 33 splits; each device rule refusing a
// call with nothing written.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/fa3.h"

namespace fa3::test {
namespace {

constexpr std::int64_t kBatch = 2, kSeqlen = 37, kHeads = 3;

// fp32 values on the device in a layout of their own (any strides), and the same values
// densely on the host.
struct DeviceScalars {
  DeviceBuffer buffer;
  TensorView view;
  std::vector<float> values;
};

// An fp32 tensor of `shape` whose last dimension has stride `step`, NaN between values.
DeviceScalars make_scalars(std::vector<std::int64_t> shape, std::int64_t step, const std::vector<float>& values) {
  DeviceScalars t;
  std::vector<std::int64_t> stride(shape.size());
  std::int64_t next = step;
  for (std::size_t i = shape.size(); i-- > 0;) {
    stride[i] = i + 1 == shape.size() ? step : next;
    next = stride[i] * shape[i];
  }
  const std::int64_t span = stride[0] * shape[0];
  std::vector<float> host(static_cast<std::size_t>(span), NAN);
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::size_t n = 0; n < values.size(); ++n) {
    std::int64_t at = 0, rest = static_cast<std::int64_t>(n);
    for (std::size_t i = shape.size(); i-- > 0;) {
      at += rest % shape[i] * stride[i];
      rest /= shape[i];
    }
    host[static_cast<std::size_t>(at)] = values[n];
  }
  t.buffer = DeviceBuffer(host.size() * sizeof(float));
  EXPECT_EQ(cudaMemcpy(t.buffer.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  t.view.data = t.buffer.get();
  t.view.dtype = DType::kFloat32;
  t.view.rank = static_cast<int>(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    t.view.shape[i] = shape[i];
    t.view.stride[i] = stride[i];
  }
  t.values = values;
  return t;
}

// Partial lse values for `parts` parts of `rows` rows: normal, spread over a range wide
// enough that some weights underflow; every seventh row -inf in every part (no part saw
// a key of it) and, in the others, part i -inf in every fifth row (part i saw none of
// that row's keys) unless that leaves the row with no part.
std::vector<std::vector<float>> random_lses(int parts, std::int64_t rows, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<std::vector<float>> lses(static_cast<std::size_t>(parts), std::vector<float>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < parts; ++i) {
      const bool dead = r % 7 == 3 || (parts > 1 && (r + i) % 5 == 0);
      lses[i][r] = dead ? -INFINITY : normal(rng);
    }
  }
  return lses;
}

bool row_is_dead(std::int64_t r) { return r % 7 == 3; }

// Sets row (b, s, h) of a (batch, seqlen, nheads, head_dim) view to NaN.
void poison_row(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h) {
  char* row = static_cast<char*>(t.data) +
              (b * t.stride[0] + s * t.stride[1] + h * t.stride[2]) * static_cast<std::int64_t>(dtype_size(t.dtype));
  if (t.stride[3] == 1) {
    fill_nan(row, t.dtype, t.shape[3]);
    return;
  }
  for (std::int64_t d = 0; d < t.shape[3]; ++d) {
    fill_nan(row + d * t.stride[3] * static_cast<std::int64_t>(dtype_size(t.dtype)), t.dtype, 1);
  }
}

// How the outputs (parts and result) are laid out.
enum class Layout {
  kContiguous,
  kPaddedRows,     // 8 NaN values after each row: strided rows, still 16-byte aligned
  kOddPaddedRows,  // 1 NaN value after each row: rows off 16-byte alignment
  kStridedValues,  // every other value (stride 2 in the last dimension)
  kMisaligned,     // the view starts one value past a 16-byte boundary
};

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kPaddedRows:
      return "padded rows";
    case Layout::kOddPaddedRows:
      return "odd padded rows";
    case Layout::kStridedValues:
      return "strided values";
    case Layout::kMisaligned:
      return "misaligned";
  }
  return "?";
}

PaddedTensor make_output(DType dtype, std::int64_t head_dim, Layout layout, std::uint64_t seed) {
  switch (layout) {
    case Layout::kContiguous:
      return make_tensor(dtype, kBatch, kSeqlen, kHeads, head_dim, seed, 0, 0, 8);
    case Layout::kPaddedRows:
      return make_tensor(dtype, kBatch, kSeqlen, kHeads, head_dim, seed, 8, 0, 8);
    case Layout::kOddPaddedRows:
      return make_tensor(dtype, kBatch, kSeqlen, kHeads, head_dim, seed, 1, 0, 8);
    case Layout::kStridedValues: {
      PaddedTensor t = make_tensor(dtype, kBatch, kSeqlen, kHeads, 2 * head_dim, seed, 0, 0, 8);
      t.view.shape[3] = head_dim;
      t.view.stride[3] = 2;
      return t;
    }
    case Layout::kMisaligned: {
      // One row more than the view holds, so that the view shifted by one value still
      // ends inside random values, not in the buffer's NaN margin.
      PaddedTensor t = make_tensor(dtype, kBatch, kSeqlen + 1, kHeads, head_dim, seed, 0, 0, 8);
      t.view.data = static_cast<char*>(t.view.data) + dtype_size(dtype);
      t.view.shape[1] = kSeqlen;
      return t;
    }
  }
  return {};
}

// Elements of t's buffer outside its view whose bytes differ from `before` (the buffer
// as it was before the call).
std::int64_t changed_outside_view(const PaddedTensor& t, const std::vector<std::uint8_t>& before) {
  const std::vector<std::uint8_t> after = t.buffer.to_host();
  const std::size_t elem = dtype_size(t.view.dtype);
  const std::int64_t start = (static_cast<const char*>(t.view.data) - static_cast<const char*>(t.buffer.get())) /
                             static_cast<std::int64_t>(elem);
  std::vector<bool> inside(after.size() / elem, false);
  const TensorView& v = t.view;
  for (std::int64_t a = 0; a < v.shape[0]; ++a)
    for (std::int64_t b = 0; b < v.shape[1]; ++b)
      for (std::int64_t c = 0; c < v.shape[2]; ++c)
        for (std::int64_t d = 0; d < v.shape[3]; ++d)
          inside[static_cast<std::size_t>(start + a * v.stride[0] + b * v.stride[1] + c * v.stride[2] +
                                          d * v.stride[3])] = true;
  std::int64_t changed = 0;
  for (std::size_t i = 0; i < inside.size(); ++i) {
    if (!inside[i] && std::memcmp(&after[i * elem], &before[i * elem], elem) != 0) ++changed;
  }
  return changed;
}

// |gpu - ref| allowed for one value: the fp32 sums may round in another order than the
// CPU's, and a 16-bit result rounds once more, by up to half a unit in its last place
// (2^-9 of the value in bf16, 2^-12 in fp16). A wrong weight or a missed part errs by a
// sizeable part of the value.
double tolerance(DType dtype, double ref) {
  const double rounding = dtype == DType::kBFloat16 ? 0x1p-8 : dtype == DType::kFloat16 ? 0x1p-11 : 0.0;
  return 1e-5 + (1e-5 + rounding) * std::fabs(ref);
}

::testing::AssertionResult values_match(const std::vector<float>& got, const std::vector<float>& ref, DType dtype,
                                        const char* what) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == ref[i]) continue;  // also equal infinities
    if (!(std::fabs(static_cast<double>(got[i]) - ref[i]) <= tolerance(dtype, ref[i]))) {
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << got[i] << ", expected " << ref[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Which tensors are not of the case's dtype.
enum class Mix {
  kNone,
  kFp32First,  // part 0 and the result fp32: a running result taking in a part
  kFp32Parts,  // every part fp32, the result in the case's dtype: a conversion
};

struct MergeCase {
  DType dtype;
  int parts;
  std::int64_t head_dim;
  Layout layout = Layout::kContiguous;
  std::int64_t lse_step = 1;  // the lses' last stride (lse values take any strides)
  bool alias = false;         // out and lse are part 0's storage
  Mix mix = Mix::kNone;
  DType part_dtype(int i) const {
    return mix == Mix::kFp32Parts || (mix == Mix::kFp32First && i == 0) ? DType::kFloat32 : dtype;
  }
  DType out_dtype() const { return mix == Mix::kFp32First ? DType::kFloat32 : dtype; }
  std::string describe() const {
    const char* mixed = mix == Mix::kFp32First ? ", part 0 and out fp32" : mix == Mix::kFp32Parts ? ", parts fp32" : "";
    return std::string(dtype_name(dtype)) + ", " + std::to_string(parts) + " parts, head dim " +
           std::to_string(head_dim) + ", " + layout_name(layout) + ", lse step " + std::to_string(lse_step) +
           (alias ? ", out on part 0" : "") + mixed;
  }
};

// The parts of a merge on the device, and the CPU merge of the same values.
struct MergeRun {
  std::vector<PaddedTensor> outs;
  std::vector<DeviceScalars> lses;
  std::vector<float> ref_out, ref_lse;  // dense (b, s, h, d) and (b, h, s)
};

MergeRun prepare(const MergeCase& c, std::uint64_t seed) {
  MergeRun run;
  const std::int64_t rows = kBatch * kHeads * kSeqlen;
  const auto lse_values = random_lses(c.parts, rows, seed);
  for (int i = 0; i < c.parts; ++i) {
    run.outs.push_back(make_output(c.part_dtype(i), c.head_dim, c.layout, seed * 131 + static_cast<std::uint64_t>(i)));
    run.lses.push_back(make_scalars({kBatch, kHeads, kSeqlen}, c.lse_step, lse_values[i]));
    // Where part i saw no key, its output holds NaN: it must not be read.
    for (std::int64_t b = 0; b < kBatch; ++b)
      for (std::int64_t h = 0; h < kHeads; ++h)
        for (std::int64_t s = 0; s < kSeqlen; ++s)
          if (lse_values[i][(b * kHeads + h) * kSeqlen + s] == -INFINITY) poison_row(run.outs.back().view, b, s, h);
  }
  // fa3::cpu's merge of the same values, in fp32 from dense host copies.
  std::vector<std::vector<float>> host_outs;
  MergeArgs ref;
  for (int i = 0; i < c.parts; ++i) host_outs.push_back(dense_host(run.outs[i].view));
  for (int i = 0; i < c.parts; ++i) {
    ref.outs.push_back(
        TensorView::contiguous(host_outs[i].data(), DType::kFloat32, {kBatch, kSeqlen, kHeads, c.head_dim}));
    ref.lses.push_back(TensorView::contiguous(const_cast<float*>(run.lses[i].values.data()), DType::kFloat32,
                                              {kBatch, kHeads, kSeqlen}));
  }
  run.ref_out.assign(static_cast<std::size_t>(rows * c.head_dim), NAN);
  run.ref_lse.assign(static_cast<std::size_t>(rows), NAN);
  ref.out = TensorView::contiguous(run.ref_out.data(), DType::kFloat32, {kBatch, kSeqlen, kHeads, c.head_dim});
  ref.lse = TensorView::contiguous(run.ref_lse.data(), DType::kFloat32, {kBatch, kHeads, kSeqlen});
  const Status st = cpu::merge_attention_states(ref);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return run;
}

// Rows no part saw: exactly 0 and -inf.
void expect_dead_rows_zero(const std::vector<float>& out, const std::vector<float>& lse, std::int64_t head_dim) {
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::int64_t h = 0; h < kHeads; ++h)
      for (std::int64_t s = 0; s < kSeqlen; ++s) {
        const std::int64_t r = (b * kHeads + h) * kSeqlen + s;
        if (!row_is_dead(r)) continue;
        ASSERT_EQ(lse[static_cast<std::size_t>(r)], -INFINITY) << "lse of row " << r;
        for (std::int64_t d = 0; d < head_dim; ++d) {
          ASSERT_EQ(out[static_cast<std::size_t>(((b * kSeqlen + s) * kHeads + h) * head_dim + d)], 0.f)
              << "row " << r << " value " << d;
        }
      }
}

void check_merge(const MergeCase& c, std::uint64_t seed) {
  SCOPED_TRACE(c.describe());
  MergeRun run = prepare(c, seed);
  MergeArgs args;
  for (int i = 0; i < c.parts; ++i) {
    args.outs.push_back(run.outs[i].view);
    args.lses.push_back(run.lses[i].view);
  }
  PaddedTensor out;
  DeviceScalars lse;
  if (c.alias) {
    args.out = run.outs[0].view;
    args.lse = run.lses[0].view;
  } else {
    out = make_output(c.out_dtype(), c.head_dim, c.layout, seed + 7);
    fill_nan(out.buffer.get(), c.out_dtype(), out.total_elements);
    lse = make_scalars({kBatch, kHeads, kSeqlen}, 2,
                       std::vector<float>(static_cast<std::size_t>(kBatch * kHeads * kSeqlen), NAN));
    args.out = out.view;
    args.lse = lse.view;
  }
  const PaddedTensor& result = c.alias ? run.outs[0] : out;
  const std::vector<std::uint8_t> before = result.buffer.to_host();
  const Status st = merge_attention_states(args, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got_out = dense_host(args.out), got_lse = dense_host(args.lse);
  EXPECT_TRUE(values_match(got_out, run.ref_out, c.out_dtype(), "out"));
  EXPECT_TRUE(values_match(got_lse, run.ref_lse, DType::kFloat32, "lse"));
  expect_dead_rows_zero(got_out, got_lse, c.head_dim);
  EXPECT_EQ(changed_outside_view(result, before), 0);
}

const DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

TEST(GpuMerge, RandomPartsMatchTheCpuMerge) {
  FA3_REQUIRE_HOPPER();
  std::uint64_t seed = 1;
  // Head dims from one value per row (one lane) to rows that take more than one pass
  // (600 fp32 values > 4 vectors on each of 32 lanes); 20 is no whole number of 16-byte
  // vectors in 16-bit types. 17 parts take the larger parameter block.
  for (DType dtype : kDtypes)
    for (int parts : {1, 2, 3, 16, 17})
      for (std::int64_t head_dim : {1, 8, 20, 40, 64, 128, 256, 600}) check_merge({dtype, parts, head_dim}, seed++);
}

TEST(GpuMerge, StridedAndMisalignedViews) {
  FA3_REQUIRE_HOPPER();
  std::uint64_t seed = 100;
  for (DType dtype : kDtypes)
    for (Layout layout : {Layout::kPaddedRows, Layout::kOddPaddedRows, Layout::kStridedValues, Layout::kMisaligned})
      for (std::int64_t head_dim : {72, 128}) check_merge({dtype, 3, head_dim, layout, 3}, seed++);
}

TEST(GpuMerge, OutAndLseMayBePartZero) {
  FA3_REQUIRE_HOPPER();
  std::uint64_t seed = 200;
  for (DType dtype : kDtypes)
    for (int parts : {1, 2, 5})
      for (std::int64_t head_dim : {128, 600})
        for (Layout layout : {Layout::kContiguous, Layout::kOddPaddedRows})
          check_merge({dtype, parts, head_dim, layout, 1, true}, seed++);
}

// The ring's calls: a 16-bit block into an fp32 running result in place, and the
// running result converted into the caller's dtype; fp32 and 16-bit values in one call
// take 4-value accesses.
TEST(GpuMerge, PartsAndResultOfTheirOwnDtypes) {
  FA3_REQUIRE_HOPPER();
  std::uint64_t seed = 250;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (std::int64_t head_dim : {1, 20, 64, 128, 600})
      for (Layout layout : {Layout::kContiguous, Layout::kOddPaddedRows}) {
        check_merge({dtype, 2, head_dim, layout, 1, false, Mix::kFp32First}, seed++);
        check_merge({dtype, 2, head_dim, layout, 1, true, Mix::kFp32First}, seed++);
        check_merge({dtype, 3, head_dim, layout, 2, false, Mix::kFp32First}, seed++);
        check_merge({dtype, 1, head_dim, layout, 1, false, Mix::kFp32Parts}, seed++);
      }
}

TEST(GpuMerge, TheMostPartsOneCallTakes) {
  FA3_REQUIRE_HOPPER();
  check_merge({DType::kBFloat16, 128, 64}, 300);
  check_merge({DType::kFloat32, 128, 64, Layout::kOddPaddedRows, 2, true}, 301);
}

// Rows 2^31 + 256 values apart: every offset past the second batch needs 64 bits.
TEST(GpuMerge, OffsetsBeyond32Bits) {
  FA3_REQUIRE_HOPPER();
  constexpr std::int64_t kDim = 64, kRowPad = (std::int64_t{1} << 31) / (2 * kDim) + 1;
  auto make = [&](std::uint64_t seed) { return make_tensor(DType::kBFloat16, 2, 1, 2, kDim, seed, 0, kRowPad); };
  PaddedTensor a = make(1), b = make(2), out = make(3);
  ASSERT_GT(a.view.stride[0], std::int64_t{1} << 31);
  fill_nan(out.buffer.get(), DType::kBFloat16, out.total_elements);
  DeviceScalars lse_a = make_scalars({2, 2, 1}, 1, {0.5f, -1.f, 2.f, -INFINITY});
  DeviceScalars lse_b = make_scalars({2, 2, 1}, 1, {1.5f, -INFINITY, 0.f, 3.f});
  DeviceScalars lse = make_scalars({2, 2, 1}, 1, std::vector<float>(4, NAN));
  MergeArgs args;
  args.outs = {a.view, b.view};
  args.lses = {lse_a.view, lse_b.view};
  args.out = out.view;
  args.lse = lse.view;
  const Status st = merge_attention_states(args, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> ha = dense_host(a.view), hb = dense_host(b.view), ref_out(ha.size(), NAN), ref_lse(4, NAN);
  MergeArgs ref;
  ref.outs = {TensorView::contiguous(ha.data(), DType::kFloat32, {2, 1, 2, kDim}),
              TensorView::contiguous(hb.data(), DType::kFloat32, {2, 1, 2, kDim})};
  ref.lses = {TensorView::contiguous(lse_a.values.data(), DType::kFloat32, {2, 2, 1}),
              TensorView::contiguous(lse_b.values.data(), DType::kFloat32, {2, 2, 1})};
  ref.out = TensorView::contiguous(ref_out.data(), DType::kFloat32, {2, 1, 2, kDim});
  ref.lse = TensorView::contiguous(ref_lse.data(), DType::kFloat32, {2, 2, 1});
  ASSERT_TRUE(cpu::merge_attention_states(ref).is_ok());
  EXPECT_TRUE(values_match(dense_host(out.view), ref_out, DType::kBFloat16, "out"));
  EXPECT_TRUE(values_match(dense_host(lse.view), ref_lse, DType::kFloat32, "lse"));
}

// ---- the split-KV combine ----

struct CombineCase {
  DType out_dtype;
  std::int64_t splits, head_dim;
  std::int64_t pad = 0;       // NaN values after each partial row (strided out_partial)
  std::int64_t lse_step = 1;  // lse_partial's and lse's last stride
  bool with_lse = true;
  std::string describe() const {
    return std::string(dtype_name(out_dtype)) + ", " + std::to_string(splits) + " splits, head dim " +
           std::to_string(head_dim) + ", pad " + std::to_string(pad) + ", lse step " + std::to_string(lse_step) +
           (with_lse ? "" : ", no lse");
  }
};

void check_combine(const CombineCase& c, std::uint64_t seed) {
  SCOPED_TRACE(c.describe());
  constexpr std::int64_t kRows = 45, kNh = 4;
  // (num_splits, rows, nheads, head_dim): make_tensor's (d0, d1, d2, d3).
  PaddedTensor partial = make_tensor(DType::kFloat32, c.splits, kRows, kNh, c.head_dim, seed, c.pad, 0, 8);
  const auto by_split = random_lses(static_cast<int>(c.splits), kRows * kNh, seed + 1);
  std::vector<float> lse_values;
  for (const auto& split : by_split) lse_values.insert(lse_values.end(), split.begin(), split.end());
  DeviceScalars lse_partial = make_scalars({c.splits, kRows, kNh}, c.lse_step, lse_values);
  for (std::int64_t sp = 0; sp < c.splits; ++sp) {
    for (std::int64_t r = 0; r < kRows; ++r) {
      for (std::int64_t h = 0; h < kNh; ++h) {
        if (by_split[sp][r * kNh + h] == -INFINITY) poison_row(partial.view, sp, r, h);
      }
    }
  }
  PaddedTensor out = make_tensor(c.out_dtype, 1, kRows, kNh, c.head_dim, seed + 2, 0, 0, 8);
  fill_nan(out.buffer.get(), c.out_dtype, out.total_elements);
  const TensorView out3 = TensorView::strided(out.view.data, c.out_dtype, {kRows, kNh, c.head_dim},
                                              {out.view.stride[1], out.view.stride[2], 1});
  DeviceScalars lse = make_scalars({kRows, kNh}, c.lse_step, std::vector<float>(kRows * kNh, NAN));

  const std::vector<std::uint8_t> before = out.buffer.to_host();
  CombineArgs args;
  args.out_partial = partial.view;
  args.lse_partial = lse_partial.view;
  args.out = out3;
  if (c.with_lse) args.lse = lse.view;
  const Status st = combine(args, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> host_partial = dense_host(partial.view);
  std::vector<float> ref_out(static_cast<std::size_t>(kRows * kNh * c.head_dim), NAN), ref_lse(kRows * kNh, NAN);
  CombineArgs ref;
  ref.out_partial = TensorView::contiguous(host_partial.data(), DType::kFloat32, {c.splits, kRows, kNh, c.head_dim});
  ref.lse_partial = TensorView::contiguous(lse_values.data(), DType::kFloat32, {c.splits, kRows, kNh});
  ref.out = TensorView::contiguous(ref_out.data(), DType::kFloat32, {kRows, kNh, c.head_dim});
  ref.lse = TensorView::contiguous(ref_lse.data(), DType::kFloat32, {kRows, kNh});
  ASSERT_TRUE(cpu::combine(ref).is_ok());

  const std::vector<float> got_out = dense_host(out3);
  EXPECT_TRUE(values_match(got_out, ref_out, c.out_dtype, "out"));
  EXPECT_EQ(changed_outside_view(out, before), 0);
  const std::vector<float> got_lse = dense_host(lse.view);
  if (c.with_lse) {
    EXPECT_TRUE(values_match(got_lse, ref_lse, DType::kFloat32, "lse"));
  } else {
    for (float x : got_lse) EXPECT_TRUE(std::isnan(x)) << "lse written though not given";
  }
  for (std::int64_t r = 0; r < kRows * kNh; ++r) {
    if (!row_is_dead(r)) continue;
    if (c.with_lse) EXPECT_EQ(got_lse[static_cast<std::size_t>(r)], -INFINITY);
    for (std::int64_t d = 0; d < c.head_dim; ++d) {
      ASSERT_EQ(got_out[static_cast<std::size_t>(r * c.head_dim + d)], 0.f) << "row " << r;
    }
  }
}

TEST(GpuCombine, SplitsMatchTheCpuCombine) {
  FA3_REQUIRE_HOPPER();
  std::uint64_t seed = 400;
  for (DType dtype : kDtypes)
    for (std::int64_t splits : {1, 2, 3, 7, 16, 33})
      for (std::int64_t head_dim : {64, 128, 256}) check_combine({dtype, splits, head_dim}, seed++);
}

TEST(GpuCombine, StridedPartialsAndOptionalLse) {
  FA3_REQUIRE_HOPPER();
  std::uint64_t seed = 500;
  for (DType dtype : kDtypes) {
    check_combine({dtype, 4, 128, 4, 3}, seed++);         // padded rows, 16-byte aligned
    check_combine({dtype, 4, 128, 1, 2}, seed++);         // rows off alignment: one value per access
    check_combine({dtype, 5, 100, 0, 1, false}, seed++);  // 25 vectors a row: lanes left idle
  }
}

// ---- rules: each refuses the call and nothing is written ----

// A valid two-part bf16 merge on the device, every output NaN.
struct DeviceMerge {
  static constexpr std::int64_t kDim = 16;
  PaddedTensor a, b, out;
  DeviceScalars lse_a, lse_b, lse;
  std::vector<float> host_out = std::vector<float>(kBatch * kSeqlen * kHeads * kDim, 1.f);
  MergeArgs args;

  DeviceMerge()
      : a(make_tensor(DType::kBFloat16, kBatch, kSeqlen, kHeads, kDim, 1)),
        b(make_tensor(DType::kBFloat16, kBatch, kSeqlen, kHeads, kDim, 2)),
        out(make_tensor(DType::kBFloat16, kBatch, kSeqlen, kHeads, kDim, 3)),
        lse_a(make_scalars({kBatch, kHeads, kSeqlen}, 1, std::vector<float>(kBatch * kHeads * kSeqlen, 0.f))),
        lse_b(make_scalars({kBatch, kHeads, kSeqlen}, 1, std::vector<float>(kBatch * kHeads * kSeqlen, 1.f))),
        lse(make_scalars({kBatch, kHeads, kSeqlen}, 1, std::vector<float>(kBatch * kHeads * kSeqlen, NAN))) {
    fill_nan(out.buffer.get(), DType::kBFloat16, out.total_elements);
    args.outs = {a.view, b.view};
    args.lses = {lse_a.view, lse_b.view};
    args.out = out.view;
    args.lse = lse.view;
  }
};

struct DeviceMergeRule {
  std::string name;
  std::function<void(DeviceMerge&)> breaks;
  StatusCode code;
  std::string message;
};

void PrintTo(const DeviceMergeRule& r, std::ostream* os) { *os << r.name; }

class GpuMergeRuleTest : public ::testing::TestWithParam<DeviceMergeRule> {};

TEST(GpuMergeRules, TheBaseArgumentsRun) {
  FA3_REQUIRE_HOPPER();
  DeviceMerge m;
  const Status st = merge_attention_states(m.args, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

TEST_P(GpuMergeRuleTest, RefusesAndWritesNothing) {
  FA3_REQUIRE_HOPPER();
  DeviceMerge m;
  GetParam().breaks(m);
  const std::vector<std::uint8_t> out_before = m.out.buffer.to_host(), lse_before = m.lse.buffer.to_host();
  const Status st = merge_attention_states(m.args, nullptr);
  EXPECT_EQ(st.code(), GetParam().code) << st.to_string();
  EXPECT_EQ(st.message(), GetParam().message);
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(m.out.buffer.to_host(), out_before);
  EXPECT_EQ(m.lse.buffer.to_host(), lse_before);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, GpuMergeRuleTest,
    ::testing::Values(
        DeviceMergeRule{"lses_count", [](DeviceMerge& m) { m.args.lses.pop_back(); }, StatusCode::kInvalidArgument,
                        "lses: one per part is needed: got 1 for 2 outs"},
        DeviceMergeRule{"dtype_int32", [](DeviceMerge& m) { m.args.outs[1].dtype = DType::kInt32; },
                        StatusCode::kInvalidArgument, "outs[1]: dtype must be fp32, fp16 or bf16, got int32"},
        DeviceMergeRule{"out_shape", [](DeviceMerge& m) { m.args.out.shape[3] = 8; }, StatusCode::kInvalidArgument,
                        "out: shape (2, 37, 3, 8) differs from outs[0]'s (2, 37, 3, 16)"},
        DeviceMergeRule{"lse_shape", [](DeviceMerge& m) { m.args.lse.shape[1] = 2; }, StatusCode::kInvalidArgument,
                        "lse: shape (2, 2, 37) must be (batch, nheads, seqlen) = (2, 3, 37)"},
        DeviceMergeRule{"part_on_host", [](DeviceMerge& m) { m.args.outs[1].data = m.host_out.data(); },
                        StatusCode::kInvalidArgument,
                        "outs[1]: pointer is host memory, not memory of the current CUDA device"},
        DeviceMergeRule{"lse_on_host", [](DeviceMerge& m) { m.args.lses[0].data = m.host_out.data(); },
                        StatusCode::kInvalidArgument,
                        "lses[0]: pointer is host memory, not memory of the current CUDA device"},
        DeviceMergeRule{"too_many_parts",
                        [](DeviceMerge& m) {
                          m.args.outs.resize(129, m.args.outs[0]);
                          m.args.lses.resize(129, m.args.lses[0]);
                        },
                        StatusCode::kNotSupported,
                        "outs: the GPU merge takes at most 128 parts, got 129; merge them in groups (each group's "
                        "out and lse are a part of the next merge)"}),
    [](const ::testing::TestParamInfo<DeviceMergeRule>& info) { return info.param.name; });

TEST(GpuCombineRules, RefusesAndWritesNothing) {
  FA3_REQUIRE_HOPPER();
  constexpr std::int64_t kSplits = 2, kRows = 3, kNh = 2, kDim = 8;
  DeviceBuffer out_partial(kSplits * kRows * kNh * kDim * sizeof(float));
  DeviceBuffer lse_partial(kSplits * kRows * kNh * sizeof(float));
  DeviceBuffer out(kRows * kNh * kDim * sizeof(float)), lse(kRows * kNh * sizeof(float));
  fill_nan(out.get(), DType::kFloat32, kRows * kNh * kDim);
  fill_nan(lse.get(), DType::kFloat32, kRows * kNh);
  std::vector<float> host(kRows * kNh, 0.f);
  const std::vector<std::uint8_t> out_before = out.to_host(), lse_before = lse.to_host();
  auto valid = [&] {
    CombineArgs a;
    a.out_partial = TensorView::contiguous(out_partial.get(), DType::kFloat32, {kSplits, kRows, kNh, kDim});
    a.lse_partial = TensorView::contiguous(lse_partial.get(), DType::kFloat32, {kSplits, kRows, kNh});
    a.out = TensorView::contiguous(out.get(), DType::kFloat32, {kRows, kNh, kDim});
    a.lse = TensorView::contiguous(lse.get(), DType::kFloat32, {kRows, kNh});
    return a;
  };
  struct Broken {
    std::function<void(CombineArgs&)> breaks;
    std::string message;
  };
  const Broken cases[] = {
      {[](CombineArgs& a) { a.out.shape[2] = 4; }, "out: shape (3, 2, 4) must be (rows, nheads, head_dim) = (3, 2, 8)"},
      {[](CombineArgs& a) { a.out_partial.dtype = DType::kBFloat16; },
       "out_partial: dtype bf16 does not match the required fp32"},
      {[&](CombineArgs& a) { a.lse.data = host.data(); },
       "lse: pointer is host memory, not memory of the current CUDA device"},
      {[&](CombineArgs& a) { a.lse_partial.data = host.data(); },
       "lse_partial: pointer is host memory, not memory of the current CUDA device"},
  };
  for (const Broken& c : cases) {
    CombineArgs a = valid();
    c.breaks(a);
    const Status st = combine(a, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), c.message);
  }
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.to_host(), out_before);
  EXPECT_EQ(lse.to_host(), lse_before);
}

}  // namespace
}  // namespace fa3::test
