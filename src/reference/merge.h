// fa3 — the CPU merge of partial attention results (fa3/merge.h), in fp32.
#pragma once

#include "fa3/merge.h"

namespace fa3::reference {

// Writes args.out and args.lse; the arguments must have passed validate_merge().
void merge_states(const MergeArgs& args);

}  // namespace fa3::reference
