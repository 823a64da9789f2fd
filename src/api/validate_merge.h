// fa3 — the rules on merge_attention_states' arguments (fa3/merge.h).
#pragma once

#include "api/validate.h"
#include "fa3/merge.h"
#include "fa3/status.h"

namespace fa3 {

// Checks every rule on host-side metadata only; reports the first one broken, naming
// the argument ("outs[1]", "lses[0]", "out", "lse"). The one-argument form holds the
// host's rules; a device target adds where each tensor lives (target.locate) and the
// most parts one call takes (target.max_merge_parts).
Status validate_merge(const MergeArgs& args);
Status validate_merge(const MergeArgs& args, const ValidationTarget& target);

}  // namespace fa3
