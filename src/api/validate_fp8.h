// fa3 — the rules of FP8 (e4m3) forward calls: the output dtype and the scales of
// Fp8Args (fa3/attention.h). Called by validate_forward; each message names the
// argument and the rule.
#pragma once

#include "api/problem.h"
#include "api/validate.h"
#include "fa3/attention.h"

namespace fa3 {

// Scales are given only with e4m3 q; with e4m3 q, out is bf16 or fp16. Runs where the
// other dtype rules run, before the shapes are known.
Status check_fp8_dtypes(const ForwardArgs& args);

// The descales and block scales against the problem's sizes (`p` from the shape rules),
// and on a device target where they live.
Status check_fp8_scales(const ForwardArgs& args, const Problem& p, const ValidationTarget& target);

// What a target refuses of a valid FP8 call (the block size its kernel reads, e4m3
// itself, e4m3 in a varlen call), after every rule on the arguments themselves, so that
// a call that is wrong anyway says what is wrong.
Status check_fp8_supported(const ForwardArgs& args, const ValidationTarget& target);

}  // namespace fa3
