// fa3 — the rules on merge_attention_states' arguments (fa3/merge.h).
#pragma once

#include "fa3/merge.h"
#include "fa3/status.h"

namespace fa3 {

// Checks every rule on host-side metadata only; reports the first one broken, naming
// the argument ("outs[1]", "lses[0]", "out", "lse").
Status validate_merge(const MergeArgs& args);

}  // namespace fa3
