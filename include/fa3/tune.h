// fa3 — autotuning: time every compiled forward kernel for a class of problems, keep the
// fastest in a per-machine cache file, and let fa3::forward run it.
//
// fa3::forward's built-in choice (shape rules chosen by measurement) is the default.
// With autotuning on, fa3::forward runs the kernel the cache names for the problem's
// class when it holds a valid entry, and the built-in choice otherwise.
//
// The cache is one text file per machine kind (tune_cache_path): its key (GPU name, SM
// count, CUDA driver version, fa3 version) must match the machine's, and every kernel
// it names must exist in this build for the entry's problem; a cache that is corrupt,
// truncated, written for another key or by a build with other kernels is ignored as a
// whole, with one warning on stderr per process, so it never selects a wrong kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "fa3/attention.h"
#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3 {

// Off unless the environment held FA3_AUTOTUNE=1 (or true, yes, on) when the process
// first asked, or set_autotune(true) was called. Off, fa3::forward never touches the
// cache. On, it reads each device's cache once per process, on the first call there.
void set_autotune(bool enabled);
bool autotune_enabled();

// Only the forward pass is tuned: the backward has one kernel per (dtype, head dim, mask).
enum class TuneDirection : std::uint8_t { kForward };

// Problems that share a tuned kernel. Sequence lengths and the GQA ratio fall into
// buckets named by their upper edge, the smallest power of two at or above the value:
// seqlen_k 1025 to 2048 is bucket 2048. Both lengths count: the key length sets the
// work of a tile, the query length the number of tiles that share the GPU.
struct TuneClass {
  TuneDirection direction = TuneDirection::kForward;
  DType dtype = DType::kBFloat16;
  int head_dim = 0;
  bool causal = false;
  std::int64_t seqlen_q = 0;  // bucket of seqlen_q
  std::int64_t seqlen_k = 0;  // bucket of seqlen_k
  std::int64_t gqa = 0;       // bucket of nheads_q / nheads_kv (1: MHA)

  // "fwd bf16 hdim128 causal q<=1024 k<=1024 gqa1"
  std::string describe() const;
};

// Written out, not defaulted: the public headers stay C++17.
inline bool operator<(const TuneClass& a, const TuneClass& b) {
  return std::tie(a.direction, a.dtype, a.head_dim, a.causal, a.seqlen_q, a.seqlen_k, a.gqa) <
         std::tie(b.direction, b.dtype, b.head_dim, b.causal, b.seqlen_q, b.seqlen_k, b.gqa);
}
inline bool operator==(const TuneClass& a, const TuneClass& b) { return !(a < b) && !(b < a); }
inline bool operator!=(const TuneClass& a, const TuneClass& b) { return !(a == b); }

// The class of `args`, validated as fa3::forward_kernels does (no GPU needed).
Status tune_class(const ForwardArgs& args, TuneClass* cls);

// What a cache's measurements hold for: another key, another cache file.
struct TuneKey {
  std::string gpu_name;  // "NVIDIA H200"
  int sm_count = 0;
  int cuda_driver = 0;      // cudaDriverGetVersion: 1000 * major + 10 * minor
  std::string fa3_version;  // build_info().version

  bool operator==(const TuneKey& o) const {
    return gpu_name == o.gpu_name && sm_count == o.sm_count && cuda_driver == o.cuda_driver &&
           fa3_version == o.fa3_version;
  }
  bool operator!=(const TuneKey& o) const { return !(*this == o); }

  // "NVIDIA H200, 132 SMs, CUDA driver 13.0, fa3 0.1.0"
  std::string describe() const;
};

// The key of the current CUDA device; kNotSupported without one.
Status current_tune_key(TuneKey* key);

// Where the cache of `key` lives: $FA3_TUNE_CACHE when set (the file itself, for every
// key), else tune-<key>.txt in $XDG_CACHE_HOME/fa3 (an absolute XDG_CACHE_HOME), else in
// $HOME/.cache/fa3. Empty when none of these is set.
std::string tune_cache_path(const TuneKey& key);

// One tuned class: the fastest kernel on the problem that was timed, and the built-in
// choice for that problem.
struct TuneEntry {
  TuneClass cls;
  std::string kernel;  // a name of fa3::forward_kernels
  double kernel_ms = 0;
  std::string heuristic;
  double heuristic_ms = 0;
};

// The entries of the cache at `path`, after checking its format and that it was written
// for `key`; a missing file holds none. kInvalidArgument says what is wrong with a file
// that fa3::forward would ignore (kernel names are checked by fa3::forward, against the
// build that runs). No warning is printed.
Status read_tune_cache(const std::string& path, const TuneKey& key, std::vector<TuneEntry>* entries);

// Adds `entries` to the cache at `path`, in order (an entry replaces the one of its
// class, so of two entries of one class the later stays), creating the file's directory.
// A file that read_tune_cache refuses is replaced. The new file is written beside the
// old under a temporary name and renamed over it, while a lock file (`path`.lock) keeps
// concurrent writers from losing each other's entries; a reader sees the old file or the
// new one, whole.
Status write_tune_cache(const std::string& path, const TuneKey& key, const std::vector<TuneEntry>& entries);

struct TuneOptions {
  int warmup = 5;     // untimed calls of each kernel first
  int iters = 20;     // timed calls of each kernel; the median counts
  bool store = true;  // add the result to the current device's cache
};

struct TuneResult {
  TuneClass cls;
  std::vector<std::string> kernels;  // timed, the built-in choice first
  std::vector<double> median_ms;     // per kernel
  TuneEntry entry;                   // the fastest (ties go to the built-in order)
  std::string cache_path;            // where the entry was stored; empty when not
};

// Times every kernel fa3::forward_kernels lists for `args` on `stream` (CUDA events
// around each call, the kernels taking turns so that clocks drift alike for all; median
// of options.iters after options.warmup) and, with options.store, adds the fastest to the
// current device's cache, where this process's fa3::forward sees it at once. args.out and
// args.lse are overwritten. kNotSupported without a Hopper GPU. A failed store returns
// its error with *result filled in but for cache_path.
Status tune_forward(const ForwardArgs& args, cudaStream_t stream, TuneResult* result, const TuneOptions& options = {});

}  // namespace fa3
