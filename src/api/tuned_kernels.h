// fa3 — fa3::forward's view of the tuning caches: each device's cache read once per
// process, checked against the build's kernels, then looked up in memory.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "api/problem.h"
#include "fa3/device.h"
#include "fa3/tune.h"

namespace fa3 {

// The names of the build's forward kernels for a class: the same for every class of one
// dtype, head dim and mask.
using KernelNames = std::function<std::vector<std::string>(const TuneClass&)>;

// The build's kernels (hopper/fwd_dispatch's list).
std::vector<std::string> built_forward_kernels(const TuneClass& cls);

// kInvalidArgument naming the first entry whose kernel `kernel_names` lacks for its
// class: the cache was written by a build with other kernels.
Status check_kernels_built(const std::vector<TuneEntry>& entries, const KernelNames& kernel_names);

class TunedKernels {
 public:
  // `warn` receives each warning's text (the process's instance prints it on stderr).
  TunedKernels(KernelNames kernel_names, std::function<void(const std::string&)> warn);

  // The kernel the cache of `device` names for `cls`, or "" when it holds no entry for
  // it (the built-in choice runs). The first call for a device loads its cache (the
  // file tune_cache_path gives for its key). A cache that read_tune_cache or
  // check_kernels_built refuses is ignored whole, with one warning for all devices.
  // Safe to call from any thread.
  std::string lookup(const DeviceInfo& device, const TuneClass& cls);

  // Adds an entry just stored in the cache of `device`, so that this process uses it at
  // once.
  void remember(const DeviceInfo& device, const TuneEntry& entry);

  // How many caches were loaded (at most one per device).
  int loads() const;

 private:
  using Table = std::map<TuneClass, std::string>;
  Table& table_for(const DeviceInfo& device);  // with mutex_ held
  Table load(const DeviceInfo& device);

  KernelNames kernel_names_;
  std::function<void(const std::string&)> warn_;
  mutable std::mutex mutex_;
  std::map<int, Table> tables_;  // by device index
  bool warned_ = false;
  int loads_ = 0;
};

// The process's instance, over the build's kernels, warning on stderr.
TunedKernels& process_tuned_kernels();

// The kernel the tuning cache names for `problem` (inputs of `dtype`) on `device`, or ""
// for fa3::forward's built-in choice. With autotuning off it returns "" at once: no file
// access, no lock.
std::string tuned_forward_kernel(const Problem& problem, DType dtype, const DeviceInfo& device);

}  // namespace fa3
