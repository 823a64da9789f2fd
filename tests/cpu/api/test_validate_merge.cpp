// The rules on merge_attention_states' arguments, broken one at a time from a valid
// two-part merge: each gives its message naming the argument, and the public entry
// point writes nothing when it refuses a call. A device target adds where each tensor
// lives and the most parts one call takes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "api/validate_merge.h"
#include "fa3/cpu.h"

namespace fa3::test {
namespace {

// batch 2, seqlen 3, nheads 4, head_dim 5; every tensor has its own storage.
struct MergeBuffers {
  std::vector<float> out_a, out_b, out, lse_a, lse_b, lse;
  MergeArgs args;

  MergeBuffers() : out_a(120, 1.f), out_b(120, 2.f), out(120, NAN), lse_a(24, 0.f), lse_b(24, 0.f), lse(24, NAN) {
    auto out_view = [](std::vector<float>& v) { return TensorView::contiguous(v.data(), DType::kFloat32, {2, 3, 4, 5}); };
    auto lse_view = [](std::vector<float>& v) { return TensorView::contiguous(v.data(), DType::kFloat32, {2, 4, 3}); };
    args.outs = {out_view(out_a), out_view(out_b)};
    args.lses = {lse_view(lse_a), lse_view(lse_b)};
    args.out = out_view(out);
    args.lse = lse_view(lse);
  }
};

struct MergeRule {
  std::string name;
  std::function<void(MergeArgs&)> breaks;
  std::string message;
};

void PrintTo(const MergeRule& c, std::ostream* os) { *os << c.name; }

std::vector<MergeRule> merge_rules() {
  return {
      {"no_parts", [](MergeArgs& a) { a.outs.clear(); }, "outs: at least one part is needed, got none"},
      {"lses_count", [](MergeArgs& a) { a.lses.pop_back(); }, "lses: one per part is needed: got 1 for 2 outs"},
      {"out_null", [](MergeArgs& a) { a.outs[1].data = nullptr; }, "outs[1]: data pointer is null"},
      {"out_rank", [](MergeArgs& a) { a.outs[0].rank = 3; },
       "outs[0]: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank 3"},
      {"out_negative_size", [](MergeArgs& a) { a.out.shape[1] = -1; },
       "out: shape (2, -1, 4, 5) has a negative size"},
      {"out_negative_stride", [](MergeArgs& a) { a.outs[1].stride[2] = -5; }, "outs[1]: stride must be >= 0, got -5"},
      {"out_dtype_int32", [](MergeArgs& a) {
         for (TensorView& t : a.outs) t.dtype = DType::kInt32;
       },
       "outs[0]: dtype must be fp32, fp16 or bf16, got int32"},
      {"result_dtype_int32", [](MergeArgs& a) { a.out.dtype = DType::kInt32; },
       "out: dtype must be fp32, fp16 or bf16, got int32"},
      {"out_shape_differs", [](MergeArgs& a) { a.outs[1].shape[3] = 4; },
       "outs[1]: shape (2, 3, 4, 4) differs from outs[0]'s (2, 3, 4, 5)"},
      {"lse_rank", [](MergeArgs& a) { a.lses[0].rank = 4; },
       "lses[0]: expected a 3-d tensor (batch, nheads, seqlen), got rank 4"},
      {"lse_dtype", [](MergeArgs& a) { a.lses[1].dtype = DType::kBFloat16; }, "lses[1]: dtype must be fp32, got bf16"},
      {"lse_seqlen_nheads_swapped", [](MergeArgs& a) { std::swap(a.lses[1].shape[1], a.lses[1].shape[2]); },
       "lses[1]: shape (2, 3, 4) must be (batch, nheads, seqlen) = (2, 4, 3)"},
      {"result_lse_null", [](MergeArgs& a) { a.lse.data = nullptr; }, "lse: data pointer is null"},
      {"result_lse_shape", [](MergeArgs& a) { a.lse.shape[0] = 1; },
       "lse: shape (1, 4, 3) must be (batch, nheads, seqlen) = (2, 4, 3)"},
  };
}

// Each part and the result have their own dtype: an fp32 part and a bf16 one (2.0 is
// 0x4000 in bf16) of equal weight merge to 1.5 in fp16 (0x3e00), lse log 2.
TEST(MergeValid, PartsAndResultMayDifferInDtype) {
  MergeBuffers m;
  std::vector<std::uint16_t> out_b(120, 0x4000), out(120, 0);
  m.args.outs[1].data = out_b.data();
  m.args.outs[1].dtype = DType::kBFloat16;
  m.args.out.data = out.data();
  m.args.out.dtype = DType::kFloat16;
  const Status st = cpu::merge_attention_states(m.args);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  for (std::uint16_t x : out) EXPECT_EQ(x, 0x3e00);
  for (float x : m.lse) EXPECT_FLOAT_EQ(x, std::log(2.f));
}

class MergeRuleTest : public ::testing::TestWithParam<MergeRule> {};

TEST(MergeValid, TheBaseArgumentsPass) {
  MergeBuffers m;
  EXPECT_TRUE(validate_merge(m.args).is_ok()) << validate_merge(m.args).to_string();
}

TEST_P(MergeRuleTest, GivesItsMessageAndWritesNothing) {
  MergeBuffers m;
  GetParam().breaks(m.args);
  const Status direct = validate_merge(m.args);
  EXPECT_EQ(direct.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(direct.message(), GetParam().message);
  const Status entry = cpu::merge_attention_states(m.args);
  EXPECT_EQ(entry.message(), GetParam().message);
  for (float x : m.out) EXPECT_TRUE(std::isnan(x));
  for (float x : m.lse) EXPECT_TRUE(std::isnan(x));
}

// A device target: every tensor in the current device's memory (here a stand-in that
// calls the part named `host` host memory), and at most max_merge_parts parts.
ValidationTarget device_target(const void* host, std::size_t max_parts) {
  ValidationTarget t;
  t.space = ValidationTarget::Space::kDevice;
  t.locate = [host](const void* p) { return p == host ? std::string("host memory") : std::string(); };
  t.max_merge_parts = max_parts;
  return t;
}

TEST(MergeDeviceRules, EachTensorMustBeDeviceMemory) {
  MergeBuffers m;
  const std::vector<std::pair<std::string, const void*>> tensors = {
      {"outs[0]", m.out_a.data()}, {"outs[1]", m.out_b.data()}, {"lses[0]", m.lse_a.data()},
      {"lses[1]", m.lse_b.data()}, {"out", m.out.data()},       {"lse", m.lse.data()}};
  for (const auto& [name, host] : tensors) {
    const Status st = validate_merge(m.args, device_target(host, 2));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(st.message(), name + ": pointer is host memory, not memory of the current CUDA device");
  }
  EXPECT_TRUE(validate_merge(m.args, device_target(nullptr, 2)).is_ok());
}

TEST(MergeDeviceRules, AtMostTheKernelsPartsPerCall) {
  MergeBuffers m;
  const Status st = validate_merge(m.args, device_target(nullptr, 1));
  EXPECT_EQ(st.code(), StatusCode::kNotSupported);
  EXPECT_EQ(st.message(),
            "outs: the GPU merge takes at most 1 parts, got 2; merge them in groups (each group's out and lse are a "
            "part of the next merge)");
  // A shape rule broken too is reported first: the limit is the device's last rule.
  m.args.out.shape[3] = 4;
  EXPECT_EQ(validate_merge(m.args, device_target(nullptr, 1)).code(), StatusCode::kInvalidArgument);
}

// The host target knows no limit on parts, nor where memory is.
TEST(MergeDeviceRules, TheHostTargetTakesAnyNumberOfParts) {
  MergeBuffers m;
  for (int i = 0; i < 200; ++i) {
    m.args.outs.push_back(m.args.outs[0]);
    m.args.lses.push_back(m.args.lses[0]);
  }
  EXPECT_TRUE(validate_merge(m.args).is_ok());
}

INSTANTIATE_TEST_SUITE_P(Rules, MergeRuleTest, ::testing::ValuesIn(merge_rules()),
                         [](const ::testing::TestParamInfo<MergeRule>& info) { return info.param.name; });

}  // namespace
}  // namespace fa3::test
