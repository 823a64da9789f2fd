// The option rules (scale, window, causal, softcap, and what a target supports), broken
// one at a time through both validate_forward and validate_backward: the two share the
// rules, and each must apply them.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "api/validate.h"
#include "rule_case.h"
#include "valid_args.h"

namespace fa3::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
const StatusCode kInvalid = StatusCode::kInvalidArgument;
const StatusCode kUnsupported = StatusCode::kNotSupported;

const char* const kScaleRule = "softmax_scale must be finite and > 0 (or 0 for the default 1/sqrt(head_dim)), got ";
const char* const kWindowRule = "window_left and window_right must be >= -1 (-1: unbounded), got ";
const char* const kSoftcapRule = "softcap must be finite and >= 0 (0: off), got ";
const char* const kNoWindow = "sliding window (window_left/window_right) is not implemented on this path yet";
const char* const kNoSoftcap = "softcap is not implemented on this path yet";

// Targets are the device-like one (no window, no softcap) unless a case says otherwise.
template <class Args>
std::vector<RuleCase<Args>> option_cases() {
  auto set = [](auto f) { return on_args<Args>([f](Args& a) { f(a.options); }); };
  using O = AttentionOptions;
  return {
      {"scale_negative", set([](O& o) { o.softmax_scale = -1.f; }), kInvalid, std::string(kScaleRule) + "-1"},
      {"scale_nan", set([](O& o) { o.softmax_scale = kNaN; }), kInvalid, std::string(kScaleRule) + "nan"},
      {"scale_inf", set([](O& o) { o.softmax_scale = kInf; }), kInvalid, std::string(kScaleRule) + "inf"},
      {"window_left_below_minus_one", set([](O& o) { o.window_left = -2; }), kInvalid,
       std::string(kWindowRule) + "(-2, -1)"},
      {"window_right_below_minus_one", set([](O& o) { o.window_right = -5; }), kInvalid,
       std::string(kWindowRule) + "(-1, -5)"},
      {"window_right_conflicts_with_causal", set([](O& o) {
         o.causal = true;
         o.window_right = 3;
       }),
       kInvalid, "window_right 3 conflicts with causal (causal means window_right = 0)"},
      {"softcap_negative", set([](O& o) { o.softcap = -0.5f; }), kInvalid, std::string(kSoftcapRule) + "-0.5"},
      {"softcap_nan", set([](O& o) { o.softcap = kNaN; }), kInvalid, std::string(kSoftcapRule) + "nan"},
      {"softcap_inf", set([](O& o) { o.softcap = kInf; }), kInvalid, std::string(kSoftcapRule) + "inf"},
      {"window_left_unsupported", set([](O& o) { o.window_left = 32; }), kUnsupported, kNoWindow},
      {"window_right_unsupported", set([](O& o) { o.window_right = 0; }), kUnsupported, kNoWindow},
      {"causal_window_left_unsupported", set([](O& o) {
         o.causal = true;
         o.window_left = 16;
       }),
       kUnsupported, kNoWindow},
      {"softcap_unsupported", set([](O& o) { o.softcap = 30.f; }), kUnsupported, kNoSoftcap},
      {"chunk_negative", set([](O& o) { o.attention_chunk = -4; }), kInvalid,
       "attention_chunk must be >= 0 (0: none), got -4"},
      {"chunk_unsupported", set([](O& o) { o.attention_chunk = 64; }), kUnsupported,
       "attention_chunk: chunked attention is not implemented on this path yet"},
      {"cpu_chunk_negative", set([](O& o) { o.attention_chunk = -1; }), kInvalid,
       "attention_chunk must be >= 0 (0: none), got -1", TargetKind::kCpu},
      {"sm_margin_negative", set([](O& o) { o.sm_margin = -2; }), kInvalid,
       "sm_margin must be >= 0 (SMs left free), got -2"},
      {"cpu_sm_margin_negative", set([](O& o) { o.sm_margin = -1; }), kInvalid,
       "sm_margin must be >= 0 (SMs left free), got -1", TargetKind::kCpu},
      // The value rules hold on the CPU target too, which supports every feature.
      {"cpu_window_conflicts_with_causal", set([](O& o) {
         o.causal = true;
         o.window_right = 1;
       }),
       kInvalid, "window_right 1 conflicts with causal (causal means window_right = 0)", TargetKind::kCpu},
      {"cpu_softcap_negative", set([](O& o) { o.softcap = -2.f; }), kInvalid, std::string(kSoftcapRule) + "-2",
       TargetKind::kCpu},
  };
}

class ForwardOptionRule : public ::testing::TestWithParam<RuleCase<ForwardArgs>> {};
TEST_P(ForwardOptionRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  check_rule<ForwardArgs>(GetParam(), valid.forward(), &validate_forward);
}
INSTANTIATE_TEST_SUITE_P(Options, ForwardOptionRule, ::testing::ValuesIn(option_cases<ForwardArgs>()),
                         case_name<ForwardArgs>);

class BackwardOptionRule : public ::testing::TestWithParam<RuleCase<BackwardArgs>> {};
TEST_P(BackwardOptionRule, IsRejectedWithItsMessage) {
  ValidArgs valid;
  check_rule<BackwardArgs>(GetParam(), valid.backward(), &validate_backward);
}
INSTANTIATE_TEST_SUITE_P(Options, BackwardOptionRule, ::testing::ValuesIn(option_cases<BackwardArgs>()),
                         case_name<BackwardArgs>);

}  // namespace
}  // namespace fa3::test
