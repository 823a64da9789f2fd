// One validation rule broken on purpose: how to break it, and the status it must give.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>

#include "api/validate.h"
#include "fa3/attention.h"
#include "valid_args.h"

namespace fa3::test {

// kDeviceWithSinks: the device-like target taking sinks, as the GPU's will once its
// kernels do, so that the rules on sinks checked before the GPU's refusal can be broken;
// kDeviceWithVarlen likewise for variable-length calls, kDeviceWithFp8 for e4m3 inputs
// (taking any block_rows).
enum class TargetKind { kDeviceLike, kCpu, kDeviceWithSinks, kDeviceWithVarlen, kDeviceWithFp8 };

template <class Args>
struct RuleCase {
  std::string name;  // gtest parameter name: letters, digits and '_' only
  // Breaks exactly one rule of valid arguments, and may adjust the target (e.g. make its
  // pointer check refuse one tensor).
  std::function<void(Args&, ValidationTarget&)> breaks;
  StatusCode code;
  std::string message;  // the whole expected message
  TargetKind target = TargetKind::kDeviceLike;
};

// Most cases touch the arguments only.
template <class Args, class F>
std::function<void(Args&, ValidationTarget&)> on_args(F f) {
  return [f](Args& a, ValidationTarget&) { f(a); };
}

template <class Args>
std::string case_name(const ::testing::TestParamInfo<RuleCase<Args>>& info) {
  return info.param.name;
}

// gtest prints a parameter in test listings: the case name says it all.
template <class Args>
void PrintTo(const RuleCase<Args>& c, std::ostream* os) {
  *os << c.name;
}

inline ValidationTarget make_target(TargetKind kind) {
  if (kind == TargetKind::kCpu) return cpu_target();
  ValidationTarget t = device_like_target();
  t.supports_sinks = kind == TargetKind::kDeviceWithSinks;
  t.supports_varlen = kind == TargetKind::kDeviceWithVarlen;
  t.supports_fp8 = kind == TargetKind::kDeviceWithFp8;
  return t;
}

template <class Args>
using Validator = Status (*)(const Args&, const ValidationTarget&, Problem*);

// The unbroken arguments pass, the broken ones give exactly the expected status, and
// the Problem is written on success only.
template <class Args>
void check_rule(const RuleCase<Args>& c, Args args, Validator<Args> validate) {
  ValidationTarget target = make_target(c.target);
  Problem accepted;
  Status before = validate(args, target, &accepted);
  ASSERT_TRUE(before.is_ok()) << "the unbroken arguments must pass: " << before.to_string();

  c.breaks(args, target);
  Problem untouched;
  untouched.batch = -7;
  Status s = validate(args, target, &untouched);
  EXPECT_EQ(s.code(), c.code) << s.to_string();
  EXPECT_EQ(s.message(), c.message);
  EXPECT_EQ(untouched.batch, -7) << "a rejected call must leave the Problem alone";
}

}  // namespace fa3::test
