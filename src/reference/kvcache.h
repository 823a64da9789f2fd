// fa3 — a KV-cache call (fa3/kvcache.h) on the CPU, as fixed-length problems of batch 1.
//
// The new keys and values are first appended into the caller's cache (rotated when the
// call has a rotary embedding); then each sequence's valid keys are gathered from its
// cache row or pages into a small contiguous copy, and every sequence runs through the
// tiled CPU path on one pool of threads. So the masks, softcap, chunks, sinks and GQA hold
// per sequence with no code of their own, and a sequence's result is bitwise that of the
// fixed-length call on its gathered keys. Everything here takes a call that
// validate_kvcache accepted on the host.
#pragma once

#include <cstdint>

#include "api/validate_kvcache.h"
#include "fa3/kvcache.h"
#include "reference/tiled_cpu.h"

namespace fa3::reference {

// Where sequence b's keys are: [first, end) of its cache positions, the new ones from
// `appended` on, and rotary position `rotary_pos` for its first new row.
struct CacheSpan {
  std::int64_t first = 0;
  std::int64_t appended = 0;
  std::int64_t end = 0;
  std::int64_t rotary_pos = 0;

  std::int64_t seqlen_k() const { return end - first; }
};

CacheSpan cache_span(const KvCacheProblem& kp, const KvCacheArgs& args, std::int64_t b);

// Rotates the first `rotary_dim` of the `dim` values x in place by position `pos` of
// the tables, pairs (2i, 2i + 1) when interleaved, else (i, i + rotary_dim / 2), in fp32.
void apply_rotary(float* x, std::int64_t rotary_dim, const TensorView& cos, const TensorView& sin, std::int64_t pos,
                  bool interleaved);

// Appends, then writes args.out (and args.lse when given).
void kvcache_forward(const KvCacheProblem& kp, const KvCacheArgs& args, const TiledCpuConfig& config = {});

}  // namespace fa3::reference
