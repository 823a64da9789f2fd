// fa3 — the exact merge of split partial results (fa3/kvcache.h, CombineArgs) on the CPU,
// in fp32 as the partials are.
#pragma once

#include "api/validate_kvcache.h"
#include "fa3/kvcache.h"

namespace fa3::reference {

// Writes args.out (and args.lse when given). `p` comes from validate_combine.
void combine(const CombineProblem& p, const CombineArgs& args);

}  // namespace fa3::reference
