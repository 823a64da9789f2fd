// fa3 — the rules of KV-cache calls (fa3/kvcache.h) and of combine calls. Each message
// names the argument and the rule; validation reads arguments only (on the host target
// also the index tensors' values), so a rejected call writes nothing, the cache included.
#pragma once

#include <cstdint>

#include "api/problem.h"
#include "api/validate.h"
#include "fa3/kvcache.h"

namespace fa3 {

// A validated KV-cache call. `attention` holds q's sizes, the head dims and the resolved
// options; its seqlen_k is not meaningful: every sequence has its own (reference/kvcache.h).
struct KvCacheProblem {
  Problem attention;
  bool paged = false;
  std::int64_t page_size = 0;   // paged: positions per page
  std::int64_t capacity = 0;    // positions each sequence's cache can hold
  std::int64_t seqlen_new = 0;  // rows of k_new / v_new; 0 without them
  std::int64_t rotary_dim = 0;  // 0: no rotary embedding
  DType out_dtype = DType::kBFloat16;  // out's: q's, or bf16 / fp16 for e4m3 inputs
};

Status validate_kvcache(const KvCacheArgs& args, const ValidationTarget& target, KvCacheProblem* problem);

// A validated combine call.
struct CombineProblem {
  std::int64_t num_splits = 0;
  std::int64_t rows = 0;
  std::int64_t nheads = 0;
  std::int64_t head_dim = 0;
};

Status validate_combine(const CombineArgs& args, const ValidationTarget& target, CombineProblem* problem);

}  // namespace fa3
