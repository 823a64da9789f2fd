// fa3 — the rules of variable-length (varlen) calls: the index tensors of VarlenArgs
// and the packed layouts of the tensors they index (fa3/attention.h). Called by
// validate_forward and validate_backward; each message names the argument and the rule.
#pragma once

#include "api/problem.h"
#include "api/validate.h"
#include "fa3/attention.h"

namespace fa3 {

// A fixed-length call leaves every field of VarlenArgs unset.
Status check_varlen_absent(const VarlenArgs& varlen);

// Packed q (total_q, nheads_q, head_dim), k (total_k, nheads_kv, head_dim) and v
// (total_k, nheads_kv, head_dim_v) against each other; fills the sizes of `p` they give.
Status check_packed_qkv_shapes(const TensorView& q, const TensorView& k, const TensorView& v, Problem* p);

// out and dout: (total_q, nheads_q, head_dim_v).
Status check_packed_out_shape(const char* name, const TensorView& t, const Problem& p);

// lse: (nheads_q, total_q).
Status check_packed_lse_shape(const TensorView& lse, const Problem& p);

// The index tensors: rank, dtype int32, lengths, contiguity and, on a device target,
// where they live; on a host target also their values (cu_seqlens from 0 and
// non-decreasing within the totals, seqused within each sequence, max_seqlen at least
// the longest sequence). Needs the totals in `p`; fills its batch, seqlens and varlen flag.
Status check_varlen_indices(const VarlenArgs& varlen, const ValidationTarget& target, Problem* p);

// One side's offsets and bound outside an attention call (fp8::quantize's varlen form):
// cu_seqlens (batch + 1, batch >= 1) as an index tensor, max_seqlen >= 0, and on a host
// target the values (0 first, non-decreasing, within the `total` rows of `rows_of`, no
// sequence longer than max_seqlen). `name` names the offsets; the bound is "max_seqlen".
Status check_sequence_offsets(const char* name, const TensorView& cu, int max_seqlen, std::int64_t total,
                              const char* rows_of, const ValidationTarget& target);

// A target without varlen refuses it after every rule on the arguments themselves, so
// that a call that is wrong anyway says what is wrong.
Status check_varlen_supported(const ValidationTarget& target);

}  // namespace fa3
