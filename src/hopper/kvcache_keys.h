// fa3 — which keys a KV-cache CTA reads: each query row's visible keys in one sequence,
// and the key blocks of a tile of rows divided among the splits. Host and device code
// (the host tests check it against fa3::Problem's definition).
#pragma once

#include "common/host_device.h"

namespace fa3::hopper {

// The keys each query row of one sequence sees, as fa3::Problem::first_key / last_key
// define them for a call of batch 1 with this sequence's lengths: window sides -1 for
// unbounded (causal is a right side of 0), chunk 0 for none.
struct SequenceMask {
  int seqlen_q, seqlen_k, left, right, chunk;

  FA3_HOST_DEVICE int chunk_start(int i) const {
    const int pos = i + seqlen_k - seqlen_q;
    const int c = pos >= 0 ? pos / chunk : -((-pos + chunk - 1) / chunk);
    return c * chunk;
  }
  FA3_HOST_DEVICE int first_key(int i) const {
    int first = 0;
    if (left >= 0) {
      const int from = i + seqlen_k - seqlen_q - left;
      first = from > 0 ? from : 0;
    }
    if (chunk > 0) {
      const int start = chunk_start(i);
      first = start > first ? start : first;
    }
    return first;
  }
  FA3_HOST_DEVICE int last_key(int i) const {
    int last = seqlen_k - 1;
    if (right >= 0) {
      const int to = i + seqlen_k - seqlen_q + right;
      last = to < last ? to : last;
    }
    if (chunk > 0) {
      const int end = chunk_start(i) + chunk - 1;
      last = end < last ? end : last;
    }
    return last;
  }
};

// Split `split` of `num_splits` over keys [key_begin, key_end) (the union of a tile's
// rows' keys) in blocks of block_n: blocks [*first, *first + count), the returned count;
// the splits take equal runs of blocks in order, the last ones possibly fewer or none.
FA3_HOST_DEVICE inline int split_blocks(int key_begin, int key_end, int block_n, int num_splits, int split,
                                        int* first) {
  *first = 0;
  if (key_end <= key_begin) return 0;
  const int n_begin = key_begin / block_n;
  const int blocks = (key_end + block_n - 1) / block_n - n_begin;
  const int per_split = (blocks + num_splits - 1) / num_splits;
  *first = n_begin + split * per_split;
  const int left = n_begin + blocks - *first;
  const int count = per_split < left ? per_split : left;
  return count > 0 ? count : 0;
}

}  // namespace fa3::hopper
