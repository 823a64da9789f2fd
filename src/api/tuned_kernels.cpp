#include "api/tuned_kernels.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "api/tune_class.h"
#include "api/tune_key.h"
#include "hopper/fwd_dispatch.h"

namespace fa3 {

std::vector<std::string> built_forward_kernels(const TuneClass& cls) {
  std::vector<std::string> names;
  for (const hopper::FwdKernelEntry& k : hopper::fwd_kernels()) {
    const hopper::MaskKind mask = cls.causal ? hopper::MaskKind::kCausal : hopper::MaskKind::kPlain;
    if (k.dtype == cls.dtype && k.head_dim == cls.head_dim && k.mask == mask) names.push_back(k.name());
  }
  return names;
}

Status check_kernels_built(const std::vector<TuneEntry>& entries, const KernelNames& kernel_names) {
  for (const TuneEntry& e : entries) {
    const std::vector<std::string> built = kernel_names(e.cls);
    if (std::find(built.begin(), built.end(), e.kernel) != built.end()) continue;
    std::string list;
    for (const std::string& name : built) list += (list.empty() ? "" : ", ") + name;
    return {StatusCode::kInvalidArgument,
            "the entry for " + e.cls.describe() + " names kernel '" + e.kernel +
                "', which this build lacks for that problem (built: " + (list.empty() ? "none" : list) + ")"};
  }
  return Status::ok();
}

TunedKernels::TunedKernels(KernelNames kernel_names, std::function<void(const std::string&)> warn)
    : kernel_names_(std::move(kernel_names)), warn_(std::move(warn)) {}

TunedKernels::Table TunedKernels::load(const DeviceInfo& device) {
  ++loads_;
  const TuneKey key = tune_key_of(device);
  std::vector<TuneEntry> entries;
  Status status = read_tune_cache(tune_cache_path(key), key, &entries);
  if (status.is_ok()) status = check_kernels_built(entries, kernel_names_);
  Table table;
  if (!status.is_ok()) {
    if (!warned_) {
      warn_("ignoring the tuning cache: " + status.message() + "; fa3::forward uses its built-in kernel choice");
      warned_ = true;
    }
    return table;
  }
  for (const TuneEntry& e : entries) table.emplace(e.cls, e.kernel);
  return table;
}

TunedKernels::Table& TunedKernels::table_for(const DeviceInfo& device) {
  auto it = tables_.find(device.index);
  if (it == tables_.end()) it = tables_.emplace(device.index, load(device)).first;
  return it->second;
}

std::string TunedKernels::lookup(const DeviceInfo& device, const TuneClass& cls) {
  std::lock_guard<std::mutex> hold(mutex_);
  const Table& table = table_for(device);
  const auto it = table.find(cls);
  return it == table.end() ? std::string() : it->second;
}

void TunedKernels::remember(const DeviceInfo& device, const TuneEntry& entry) {
  std::lock_guard<std::mutex> hold(mutex_);
  // A device whose cache is not loaded yet reads the entry from the file when it is.
  const auto it = tables_.find(device.index);
  if (it != tables_.end()) it->second[entry.cls] = entry.kernel;
}

int TunedKernels::loads() const {
  std::lock_guard<std::mutex> hold(mutex_);
  return loads_;
}

TunedKernels& process_tuned_kernels() {
  static TunedKernels instance(built_forward_kernels, [](const std::string& message) {
    std::fprintf(stderr, "fa3: warning: %s\n", message.c_str());
  });
  return instance;
}

std::string tuned_forward_kernel(const Problem& problem, DType dtype, const DeviceInfo& device) {
  if (!autotune_enabled()) return "";
  return process_tuned_kernels().lookup(device, tune_class_of(problem, dtype));
}

}  // namespace fa3
