#include "tune_bindings.h"

#include <cuda_runtime_api.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "call_status.h"
#include "dlpack_views.h"
#include "fa3/fa3.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace fa3::python {
namespace {

// A dict's value under `name`, converted; ValueError naming `what` and `name` otherwise.
template <class T>
T field(const nb::dict& d, const char* what, const char* name) {
  if (!d.contains(name)) throw nb::value_error((std::string(what) + ": missing '" + name + "'").c_str());
  T value;
  if (!nb::try_cast(d[name], value)) {
    throw nb::value_error((std::string(what) + "['" + name + "']: wrong type").c_str());
  }
  return value;
}

DType dtype_from(const std::string& name, const char* what) {
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat32}) {
    if (name == dtype_name(d)) return d;
  }
  throw nb::value_error((std::string(what) + "['dtype']: unknown dtype '" + name + "'").c_str());
}

TuneKey key_from(const nb::dict& d) {
  TuneKey key;
  key.gpu_name = field<std::string>(d, "key", "gpu_name");
  key.sm_count = field<int>(d, "key", "sm_count");
  key.cuda_driver = field<int>(d, "key", "cuda_driver");
  key.fa3_version = field<std::string>(d, "key", "fa3_version");
  return key;
}

nb::dict key_dict(const TuneKey& key) {
  nb::dict d;
  d["gpu_name"] = key.gpu_name;
  d["sm_count"] = key.sm_count;
  d["cuda_driver"] = key.cuda_driver;
  d["fa3_version"] = key.fa3_version;
  return d;
}

// An entry's dict: its class's fields and description ("class", not read back), the
// fastest kernel and the built-in choice with their times.
nb::dict entry_dict(const TuneEntry& e) {
  nb::dict d;
  d["class"] = e.cls.describe();
  d["direction"] = "fwd";
  d["dtype"] = dtype_name(e.cls.dtype);
  d["head_dim"] = e.cls.head_dim;
  d["causal"] = e.cls.causal;
  d["seqlen_q"] = e.cls.seqlen_q;
  d["seqlen_k"] = e.cls.seqlen_k;
  d["gqa"] = e.cls.gqa;
  d["kernel"] = e.kernel;
  d["kernel_ms"] = e.kernel_ms;
  d["heuristic"] = e.heuristic;
  d["heuristic_ms"] = e.heuristic_ms;
  return d;
}

TuneEntry entry_from(const nb::dict& d, const std::string& what) {
  const char* w = what.c_str();
  if (d.contains("direction") && field<std::string>(d, w, "direction") != "fwd") {
    throw nb::value_error((what + "['direction']: only 'fwd' is tuned").c_str());
  }
  TuneEntry e;
  e.cls.dtype = dtype_from(field<std::string>(d, w, "dtype"), w);
  e.cls.head_dim = field<int>(d, w, "head_dim");
  e.cls.causal = field<bool>(d, w, "causal");
  e.cls.seqlen_q = field<std::int64_t>(d, w, "seqlen_q");
  e.cls.seqlen_k = field<std::int64_t>(d, w, "seqlen_k");
  e.cls.gqa = field<std::int64_t>(d, w, "gqa");
  e.kernel = field<std::string>(d, w, "kernel");
  e.kernel_ms = field<double>(d, w, "kernel_ms");
  e.heuristic = field<std::string>(d, w, "heuristic");
  e.heuristic_ms = field<double>(d, w, "heuristic_ms");
  return e;
}

nb::dict tune_forward(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
                      const std::optional<OutArray>& lse, float softmax_scale, bool causal, int warmup, int iters,
                      bool store, std::uintptr_t stream) {
  Placement where;
  ForwardArgs args;
  args.q = to_view("q", q, where);
  args.k = to_view("k", k, where);
  args.v = to_view("v", v, where);
  args.out = to_view("out", out, where);
  if (lse) args.lse = to_view("lse", *lse, where);
  args.options.softmax_scale = softmax_scale;
  args.options.causal = causal;
  TuneOptions options;
  options.warmup = warmup;
  options.iters = iters;
  options.store = store;

  TuneResult result;
  Status status;
  {
    nb::gil_scoped_release no_gil;
    // Host tensors go to the library too, which explains why it cannot time them.
    const int device = where.on_cuda() ? where.device_id() : -1;
    status = on_device(
        device, [&] { return fa3::tune_forward(args, reinterpret_cast<cudaStream_t>(stream), &result, options); });
  }
  raise_if_error(status);
  nb::dict d = entry_dict(result.entry);
  d["kernels"] = result.kernels;
  d["median_ms"] = result.median_ms;
  d["cache_path"] = result.cache_path;
  return d;
}

nb::dict tune_key(int device) {
  TuneKey key;
  raise_if_error(on_device(device, [&] { return current_tune_key(&key); }));
  return key_dict(key);
}

std::string cache_path(const nb::dict& key) { return tune_cache_path(key_from(key)); }

std::vector<nb::dict> read_cache(const std::string& path, const nb::dict& key) {
  std::vector<TuneEntry> entries;
  raise_if_error(read_tune_cache(path, key_from(key), &entries));
  std::vector<nb::dict> out;
  for (const TuneEntry& e : entries) out.push_back(entry_dict(e));
  return out;
}

void write_cache(const std::string& path, const nb::dict& key, const std::vector<nb::dict>& entries) {
  std::vector<TuneEntry> converted;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    converted.push_back(entry_from(entries[i], "entries[" + std::to_string(i) + "]"));
  }
  const TuneKey k = key_from(key);
  Status status;
  {
    nb::gil_scoped_release no_gil;
    status = write_tune_cache(path, k, converted);
  }
  raise_if_error(status);
}

}  // namespace

void register_tune_bindings(nb::module_& m) {
  m.def("set_autotune", &set_autotune, "enabled"_a,
        "Turns autotuning on or off for this process: on, forward() on CUDA tensors runs the tuning cache's\n"
        "kernel for the problem's class when the cache holds one. The default comes from FA3_AUTOTUNE.");
  m.def("autotune_enabled", &autotune_enabled, "Whether autotuning is on.");
  m.def("tune_forward", &tune_forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), nb::kw_only(),
        "softmax_scale"_a = 0.f, "causal"_a = false, "warmup"_a = 5, "iters"_a = 20, "store"_a = true, "stream"_a = 0,
        "Times every compiled forward kernel on these CUDA tensors (out and lse are overwritten) and, with\n"
        "store, adds the fastest to the tuning cache of their device. Returns the entry's dict plus\n"
        "kernels, median_ms (per kernel, the built-in choice first) and cache_path ('' when not stored).\n"
        "Raises NotImplementedError without a Hopper GPU.");
  m.def("tune_key", &tune_key, "device"_a = -1,
        "The tuning cache's key for CUDA device `device` (-1: the current one): gpu_name, sm_count,\n"
        "cuda_driver, fa3_version. Raises NotImplementedError without a CUDA device.");
  m.def("tune_cache_path", &cache_path, "key"_a,
        "The cache file of `key` (a tune_key() dict): $FA3_TUNE_CACHE, else under $XDG_CACHE_HOME/fa3 or\n"
        "~/.cache/fa3; '' when none of these is set.");
  m.def("read_tune_cache", &read_cache, "path"_a, "key"_a,
        "The entries of the cache at `path` written for `key` (none when there is no file). Raises ValueError\n"
        "saying why for a file fa3 ignores: corrupt, truncated, another format version, another key.");
  m.def("write_tune_cache", &write_cache, "path"_a, "key"_a, "entries"_a,
        "Adds entries (dicts as read_tune_cache returns; 'class' is not read) to the cache at `path`,\n"
        "replacing those of their classes; the file is replaced atomically.");
}

}  // namespace fa3::python
