// The rules on attention sinks (sinks in both passes, dsinks in the backward), broken one
// at a time from valid arguments that carry them: each rule's message names the argument,
// invalid sinks are reported before the GPU's refusal of sinks, and the size query
// refuses sinks as backward() does.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "api/validate.h"
#include "fa3/attention.h"
#include "hopper/bwd_dispatch.h"
#include "rule_case.h"
#include "valid_args.h"

namespace fa3::test {
namespace {

const StatusCode kInvalid = StatusCode::kInvalidArgument;
const StatusCode kUnsupported = StatusCode::kNotSupported;

// The base shape has 4 query heads (and 2 KV heads): sinks are fp32 (4).
template <class Args>
std::vector<RuleCase<Args>> sinks_cases() {
  auto on = [](auto f) { return on_args<Args>(f); };
  return {
      {"sinks_rank_2", on([](Args& a) {
         a.sinks = TensorView::contiguous(a.sinks.data, DType::kFloat32, {4, 1});
       }),
       kInvalid, "sinks: expected a 1-d tensor (nheads_q), got rank 2", TargetKind::kCpu},
      {"sinks_dtype_bf16", on([](Args& a) { a.sinks.dtype = DType::kBFloat16; }), kInvalid,
       "sinks: dtype must be fp32, got bf16", TargetKind::kCpu},
      {"sinks_length_is_nheads_kv", on([](Args& a) { a.sinks.shape[0] = 2; }), kInvalid,
       "sinks: shape (2) must be (nheads_q) = (4)", TargetKind::kCpu},
      {"sinks_length_zero", on([](Args& a) { a.sinks.shape[0] = 0; }), kInvalid,
       "sinks: shape (0) must be (nheads_q) = (4)", TargetKind::kCpu},
      {"sinks_stride_negative", on([](Args& a) { a.sinks.stride[0] = -1; }), kInvalid,
       "sinks: stride must be >= 0, got -1", TargetKind::kCpu},
      {"sinks_not_element_aligned", on([](Args& a) { shift_pointer(a.sinks, 2); }), kInvalid,
       "sinks: data pointer is not aligned to its element size", TargetKind::kDeviceWithSinks},
      {"sinks_not_device_memory",
       [](Args& a, ValidationTarget& t) {
         t = device_like_target(a.sinks.data, "host memory");
         t.supports_sinks = true;
       },
       kInvalid, "sinks: pointer is host memory, not memory of the current CUDA device", TargetKind::kDeviceWithSinks},
      {"sinks_on_gpu", [](Args&, ValidationTarget& t) { t.supports_sinks = false; }, kUnsupported,
       "sinks: attention sinks are not implemented on the GPU yet", TargetKind::kDeviceWithSinks},
  };
}

std::vector<RuleCase<BackwardArgs>> dsinks_cases() {
  using Args = BackwardArgs;
  return {
      {"dsinks_without_sinks", on_args<Args>([](Args& a) { a.sinks = TensorView{}; }), kInvalid,
       "dsinks: given without sinks (it is the gradient of sinks)", TargetKind::kCpu},
      {"dsinks_rank_2", on_args<Args>([](Args& a) {
         a.dsinks = TensorView::contiguous(a.dsinks.data, DType::kFloat32, {1, 4});
       }),
       kInvalid, "dsinks: expected a 1-d tensor (nheads_q), got rank 2", TargetKind::kCpu},
      {"dsinks_dtype_fp16", on_args<Args>([](Args& a) { a.dsinks.dtype = DType::kFloat16; }), kInvalid,
       "dsinks: dtype must be fp32, got fp16", TargetKind::kCpu},
      {"dsinks_length_is_nheads_q_plus_one", on_args<Args>([](Args& a) { a.dsinks.shape[0] = 5; }), kInvalid,
       "dsinks: shape (5) must be (nheads_q) = (4)", TargetKind::kCpu},
      {"dsinks_stride_negative", on_args<Args>([](Args& a) { a.dsinks.stride[0] = -2; }), kInvalid,
       "dsinks: stride must be >= 0, got -2", TargetKind::kCpu},
      {"dsinks_not_element_aligned", on_args<Args>([](Args& a) { shift_pointer(a.dsinks, 1); }), kInvalid,
       "dsinks: data pointer is not aligned to its element size", TargetKind::kDeviceWithSinks},
      {"dsinks_not_device_memory",
       [](Args& a, ValidationTarget& t) {
         t = device_like_target(a.dsinks.data, "pinned host memory");
         t.supports_sinks = true;
       },
       kInvalid, "dsinks: pointer is pinned host memory, not memory of the current CUDA device",
       TargetKind::kDeviceWithSinks},
  };
}

std::vector<RuleCase<BackwardArgs>> backward_cases() {
  std::vector<RuleCase<BackwardArgs>> all = sinks_cases<BackwardArgs>();
  for (RuleCase<BackwardArgs>& c : dsinks_cases()) all.push_back(std::move(c));
  return all;
}

class ForwardSinksRule : public ::testing::TestWithParam<RuleCase<ForwardArgs>> {};
TEST_P(ForwardSinksRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  check_rule<ForwardArgs>(GetParam(), valid.forward_with_sinks(), &validate_forward);
}
INSTANTIATE_TEST_SUITE_P(Sinks, ForwardSinksRule, ::testing::ValuesIn(sinks_cases<ForwardArgs>()),
                         case_name<ForwardArgs>);

class BackwardSinksRule : public ::testing::TestWithParam<RuleCase<BackwardArgs>> {};
TEST_P(BackwardSinksRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  check_rule<BackwardArgs>(GetParam(), valid.backward_with_sinks(), &validate_backward);
}
INSTANTIATE_TEST_SUITE_P(Sinks, BackwardSinksRule, ::testing::ValuesIn(backward_cases()), case_name<BackwardArgs>);

// Views of any non-negative stride are accepted: 0 broadcasts one sink to every head.
TEST(ValidateSinks, AnyStrideIsAccepted) {
  ValidArgs valid;
  std::vector<float> storage(16);
  for (std::int64_t stride : {0, 1, 3}) {
    SCOPED_TRACE(stride);
    const TensorView view = TensorView::strided(storage.data(), DType::kFloat32, {4}, {stride});
    ForwardArgs f = valid.forward();
    f.sinks = view;
    BackwardArgs b = valid.backward();
    b.sinks = view;
    b.dsinks = view;
    Problem p;
    Status s = validate_forward(f, cpu_target(), &p);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    s = validate_backward(b, cpu_target(), &p);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
}

// A backward that takes sinks need not give their gradient (frozen sinks).
TEST(ValidateSinks, BackwardTakesSinksWithoutDsinks) {
  ValidArgs valid;
  BackwardArgs a = valid.backward_with_sinks();
  a.dsinks = TensorView{};
  Problem p;
  const Status s = validate_backward(a, cpu_target(), &p);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

// The GPU's refusal comes after every rule on the arguments themselves, so that a call
// that is wrong anyway says what is wrong with it.
TEST(ValidateSinks, InvalidSinksAreReportedBeforeTheGpuRefusal) {
  ValidArgs valid;
  ForwardArgs a = valid.forward_with_sinks();
  a.sinks.shape[0] = 3;
  Problem p;
  const Status s = validate_forward(a, device_like_target(), &p);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_EQ(s.message(), "sinks: shape (3) must be (nheads_q) = (4)");

  const Status valid_sinks = validate_forward(valid.forward_with_sinks(), device_like_target(), &p);
  EXPECT_EQ(valid_sinks.code(), kUnsupported);
  EXPECT_EQ(valid_sinks.message(), "sinks: attention sinks are not implemented on the GPU yet");
}

// The library's GPU targets take sinks (the general kernels read them), and the
// problem says so, which sends it to those kernels.
TEST(ValidateSinks, GpuTargetsTakeSinks) {
  EXPECT_TRUE(gpu_target().supports_sinks);
  EXPECT_TRUE(gpu_backward_target().supports_sinks);
  ValidArgs valid;
  ValidationTarget t = gpu_target();
  t.locate = nullptr;
  t.dtypes = {DType::kBFloat16};
  t.head_dims = {128};
  Problem p;
  const Status s = validate_forward(valid.forward_with_sinks(), t, &p);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(p.has_sinks);
  const Status plain = validate_forward(valid.forward(), t, &p);
  ASSERT_TRUE(plain.is_ok()) << plain.to_string();
  EXPECT_FALSE(p.has_sinks);
}

// fa3::backward_workspace_size sizes a call with sinks as one without: the sinks'
// gradient needs no workspace of its own.
TEST(ValidateSinks, WorkspaceSizeQueryTakesSinks) {
  const std::vector<DType> dtypes = hopper::bwd_dtypes();
  const std::vector<int> dims = hopper::bwd_head_dims();
  if (dtypes.empty()) GTEST_SKIP() << "no backward kernels were built";
  ArgsShape shape;
  shape.dtype = dtypes.front();
  shape.head_dim = dims.front();
  ValidArgs valid(shape);
  std::size_t with = 0, without = 0;
  const Status s = backward_workspace_size(valid.backward_with_sinks(), &with);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_TRUE(backward_workspace_size(valid.backward(), &without).is_ok());
  EXPECT_EQ(with, without);
}

}  // namespace
}  // namespace fa3::test
