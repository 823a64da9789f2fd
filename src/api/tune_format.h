// fa3 — the tuning cache's text format (version 1).
//
//   fa3 tune cache<TAB>1
//   gpu<TAB>NVIDIA H200
//   sm_count<TAB>132
//   cuda_driver<TAB>13000
//   fa3<TAB>0.1.0
//   # direction dtype head_dim mask seqlen_q seqlen_k gqa kernel kernel_ms heuristic heuristic_ms
//   fwd<TAB>bf16<TAB>128<TAB>causal<TAB>1024<TAB>1024<TAB>1<TAB>128x128-c2<TAB>0.91<TAB>128x128<TAB>0.95
//   end<TAB>1
//
// One tab separates fields, since GPU names hold spaces. The first line names the format
// and its version; the next four are the key; then one line per entry (seqlen_q, seqlen_k
// and gqa are the class's buckets; times in milliseconds), in any order, '#' lines being
// comments; the last line counts the entries, so that a file cut short anywhere, even
// between two entries, is refused. Every line ends with a line break.
#pragma once

#include <string>
#include <vector>

#include "fa3/status.h"
#include "fa3/tune.h"

namespace fa3 {

inline constexpr int kTuneFormatVersion = 1;

// kInvalidArgument naming the field ("key.gpu_name: ...", "entries[2].kernel: ...") when
// `key` or `entries` cannot be written: a name that is empty or holds a tab, a line break
// or (kernel names) a space; a head dim outside 1 to 256; a bucket that is not a power of
// two up to 2^31; a time that is not finite and > 0.
Status check_tune_contents(const TuneKey& key, const std::vector<TuneEntry>& entries);

// The file's text; `key` and `entries` must pass check_tune_contents, and no two entries
// may share a class.
std::string format_tune_cache(const TuneKey& key, const std::vector<TuneEntry>& entries);

// Reads `text` into `entries`. kInvalidArgument ("line 3: ...") for anything but a whole
// file of this format version written for `key`, with contents check_tune_contents accepts.
Status parse_tune_cache(const std::string& text, const TuneKey& key, std::vector<TuneEntry>* entries);

}  // namespace fa3
