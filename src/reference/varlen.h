// fa3 — a variable-length (varlen) batch as fixed-length problems, one per sequence.
//
// The CPU paths run each sequence through the code of a fixed-length call of batch 1,
// on views into the packed tensors, so that the masks (aligned to each sequence's own
// lengths), the softcap, chunks, sinks and GQA hold per sequence with no code of their
// own, and a sequence's results are bitwise those of the same sequence run alone.
// Everything here takes a call that validate_forward / validate_backward accepted on
// the host: the index tensors are host memory with valid values.
#pragma once

#include <cstdint>
#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"
#include "reference/naive.h"
#include "reference/tiled_cpu.h"

namespace fa3::reference {

// Rows [begin, end) of a packed tensor.
struct RowRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// One sequence: its query rows and its keys in the packed tensors, `used` of each
// taking part (seqused, else all of them).
struct Sequence {
  std::int64_t index = 0;  // b, its place in the batch (the FP8 scales' first index)
  std::int64_t q_start = 0, q_used = 0, q_end = 0;
  std::int64_t k_start = 0, k_used = 0, k_end = 0;
};

// The sequences of a varlen call, read from its index tensors.
std::vector<Sequence> varlen_sequences(const VarlenArgs& varlen);

// Sequence `s` of the varlen problem `whole` as a fixed-length problem of batch 1 (its
// used lengths as seqlen_q and seqlen_k; the options are the whole call's).
Problem sequence_problem(const Problem& whole, const Sequence& s);

// Rows [start, start + rows) of a packed (total, nheads, dim) view as a (1, rows,
// nheads, dim) view, and entries [start, start + rows) of a packed (nheads, total) lse
// as a (1, nheads, rows) view.
TensorView rows_view(const TensorView& packed, std::int64_t start, std::int64_t rows);
TensorView lse_view(const TensorView& packed, std::int64_t start, std::int64_t rows);

// The rows of q (out, lse, dq) and of k and v (dk, dv) that take part in no sequence:
// those past seqused, and those past cu_seqlens[batch].
std::vector<RowRange> unused_query_rows(const std::vector<Sequence>& seqs, std::int64_t total_q);
std::vector<RowRange> unused_key_rows(const std::vector<Sequence>& seqs, std::int64_t total_k);

// The tiled CPU path on a varlen call: every sequence's query blocks shared by one pool
// of threads, then out 0 and lse -inf written to the query rows of no sequence.
void varlen_tiled_forward(const Problem& p, const ForwardArgs& args, const TiledCpuConfig& config = {});

// The naive reference on a varlen call, in packed canonical layouts: out (total_q,
// nheads_q, head_dim_v) and lse (nheads_q, total_q), rows of no sequence 0 and -inf.
ForwardResult varlen_forward(const Problem& p, const ForwardArgs& args, Precision precision = Precision::kExact);

// The naive reference's gradients of a varlen call, in packed canonical layouts: dq
// (total_q, nheads_q, head_dim), dk (total_k, nheads_kv, head_dim), dv (total_k,
// nheads_kv, head_dim_v), 0 in the rows of no sequence; dsinks summed over the sequences.
BackwardResult varlen_backward(const Problem& p, const BackwardArgs& args, Precision precision = Precision::kExact);

}  // namespace fa3::reference
