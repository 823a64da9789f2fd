// fa3 program — the exact (fp64) gradients of sampled rows, so that the backward of a
// problem of any size can be checked without its full reference.
//
// For query row i of a head and key j it sees, with s_ij its score after the scale
// and the softcap, and lse_i including the head's sink when there are sinks:
//   P_ij = exp(s_ij - lse_i),   dP_ij = dO_i . v_j,   D_i = sum_j P_ij dP_ij,
//   dS_ij = P_ij (dP_ij - D_i) * ds_ij / d(q_i . k_j),
//   dq_i = sum_j dS_ij k_j,   dk_j = sum dS_ij q_i,   dv_j = sum P_ij dO_i,
// dk and dv summing over every row of every query head of j's KV group that sees j.
// lse_i and D_i need all of row i's keys, so a dq row costs O(seqlen_k * (head_dim +
// head_dim_v)), and each (batch, KV head) holding sampled keys costs about one forward
// pass of its query heads, shared by all the sampled keys it holds.
#pragma once

#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"
#include "reference/naive.h"

namespace fa3::cli {

struct GradientRows {
  std::vector<double> dq;  // dq[r * head_dim + c]: query row r of the sample
  std::vector<double> dk;  // dk[r * head_dim + c]: key row r of the sample
  std::vector<double> dv;  // dv[r * head_dim_v + c]
};

// `args` are host views; only q, k, v, dout and the sinks are read (lse and D are
// recomputed). The sinks' own gradient is not computed.
// Key rows are RowRefs whose head is a KV head and whose row is a key. `threads` 0: one
// per hardware thread; the result does not depend on it beyond fp64 rounding.
GradientRows reference_gradients(const Problem& p, const BackwardArgs& args,
                                 const std::vector<reference::RowRef>& query_rows,
                                 const std::vector<reference::RowRef>& key_rows, int threads);

}  // namespace fa3::cli
