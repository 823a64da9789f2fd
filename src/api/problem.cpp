#include "api/problem.h"

namespace fa3 {

double Problem::forward_flops() const {
  double pairs = 0;
  const bool plain_causal = causal && window_left < 0 && chunk == 0 && seqlen_q == seqlen_k;
  if (!restricts_keys()) {
    pairs = static_cast<double>(seqlen_q) * static_cast<double>(seqlen_k);
  } else if (plain_causal) {
    pairs = 0.5 * static_cast<double>(seqlen_q) * static_cast<double>(seqlen_k);
  } else {
    for (std::int64_t i = 0; i < seqlen_q; ++i) {
      std::int64_t n = last_key(i) - first_key(i) + 1;
      if (n > 0) pairs += static_cast<double>(n);
    }
  }
  return 2.0 * static_cast<double>(batch) * static_cast<double>(nheads_q) * pairs *
         static_cast<double>(head_dim + head_dim_v);
}

}  // namespace fa3
