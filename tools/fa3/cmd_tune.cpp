// `fa3 tune`: times every compiled forward kernel on a sweep of problems (or one) and
// stores the fastest of each problem class in the tuning cache; `fa3 tune --show` lists
// the cache of this machine's GPU.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "api/tuned_kernels.h"
#include "bench_output.h"
#include "commands.h"
#include "common_flags.h"
#include "cuda_resources.h"
#include "device_choice.h"
#include "device_tensors.h"
#include "errors.h"
#include "fa3/device.h"
#include "fa3/tune.h"
#include "flags.h"
#include "host_tensors.h"
#include "shape.h"
#include "tune_report.h"

namespace fa3::cli {
namespace {

// The ANCHORS.md sweep, `fa3 bench`'s default on the GPU: batch x seqlen = tokens and
// nheads x head dim = hidden in every shape.
const std::vector<std::int64_t> kSweepHeadDims = {64, 128, 256};
const std::vector<std::int64_t> kSweepSeqlens = {512, 1024, 2048, 4096, 8192, 16384};
constexpr std::int64_t kSweepTokens = 16384;
constexpr std::int64_t kSweepHidden = 2048;
// Iteration counts beyond this are typos, as in `fa3 run`.
constexpr std::int64_t kMaxCalls = 1'000'000;

struct TuneConfig {
  // A sweep, the default.
  std::vector<std::int64_t> head_dims;  // empty: the compiled ones of kSweepHeadDims
  std::vector<std::int64_t> seqlens;    // empty: kSweepSeqlens
  std::vector<std::int64_t> gqa = {1};
  std::int64_t tokens = kSweepTokens;
  std::int64_t hidden = kSweepHidden;
  bool causal_only = false;
  bool non_causal_only = false;
  // One problem, when any of its flags is given.
  AttentionShape shape;
  std::vector<std::string> sweep_flags;    // given on the command line, for conflict messages
  std::vector<std::string> problem_flags;  // likewise
  std::vector<std::string> flags;          // every flag given
  DType dtype = DType::kBFloat16;
  TuneOptions options;
  std::uint64_t seed = 0;
  bool dry_run = false;
  bool show = false;
};

// `flag`, noting its name in each of `given` when it is applied.
Flag noted(Flag flag, std::vector<std::vector<std::string>*> given) {
  auto apply = flag.apply;
  const std::string name = "--" + flag.name;
  flag.apply = [apply, name, given](const std::string& v) {
    for (std::vector<std::string>* g : given) g->push_back(name);
    apply(v);
  };
  return flag;
}

// The compiled ones among `wanted` (all compiled head dims when none is).
std::vector<std::int64_t> compiled_head_dims(const std::vector<std::int64_t>& wanted) {
  const std::vector<int>& built = build_info().head_dims;
  std::vector<std::int64_t> kept;
  for (std::int64_t d : wanted) {
    for (int b : built) {
      if (b == d) kept.push_back(d);
    }
  }
  if (kept.empty()) kept.assign(built.begin(), built.end());
  return kept;
}

// Sweep shapes by head dim, then causal, then GQA ratio, then seqlen (query and key
// lengths equal).
std::vector<AttentionShape> sweep_shapes(const TuneConfig& c) {
  const std::vector<std::int64_t> head_dims = c.head_dims.empty() ? compiled_head_dims(kSweepHeadDims) : c.head_dims;
  const std::vector<std::int64_t>& seqlens = c.seqlens.empty() ? kSweepSeqlens : c.seqlens;
  std::vector<bool> causal_modes;
  if (!c.causal_only || c.non_causal_only) causal_modes.push_back(false);
  if (c.causal_only || !c.non_causal_only) causal_modes.push_back(true);
  std::vector<AttentionShape> shapes;
  for (std::int64_t d : head_dims) {
    const std::int64_t nheads = std::max<std::int64_t>(1, c.hidden / d);
    for (bool causal : causal_modes) {
      for (std::int64_t ratio : c.gqa) {
        if (nheads % ratio != 0) {
          throw UsageError("--gqa " + std::to_string(ratio) + " does not divide nheads " + std::to_string(nheads) +
                           " (--hidden " + std::to_string(c.hidden) + " / head dim " + std::to_string(d) + ")");
        }
        for (std::int64_t seqlen : seqlens) {
          AttentionShape s;
          s.batch = std::max<std::int64_t>(1, c.tokens / seqlen);
          s.seqlen_q = s.seqlen_k = seqlen;
          s.nheads_q = nheads;
          s.nheads_kv = nheads / ratio;
          s.head_dim = d;
          s.dtype = c.dtype;
          s.options.causal = causal;
          shapes.push_back(s);
        }
      }
    }
  }
  return shapes;
}

TuneConfig parse_tune(const std::vector<std::string>& args) {
  TuneConfig c;
  AttentionShape& s = c.shape;
  std::int64_t seqlen = s.seqlen_q;
  std::optional<std::int64_t> seqlen_q, seqlen_k, nheads_kv;
  const auto sweep = [&](Flag f) { return noted(std::move(f), {&c.sweep_flags, &c.flags}); };
  const auto problem = [&](Flag f) { return noted(std::move(f), {&c.problem_flags, &c.flags}); };
  const auto other = [&](Flag f) { return noted(std::move(f), {&c.flags}); };
  const std::vector<Flag> flags = {
      sweep({"head-dims", true,
             [&](const std::string& v) { c.head_dims = parse_int_list("head-dims", v, 1, kMaxSize); }}),
      sweep({"seqlens", true, [&](const std::string& v) { c.seqlens = parse_int_list("seqlens", v, 1, kMaxSize); }}),
      sweep({"gqa", true, [&](const std::string& v) { c.gqa = parse_int_list("gqa", v, 1, kMaxSize); }}),
      sweep(size_flag("tokens", &c.tokens)),
      sweep(size_flag("hidden", &c.hidden)),
      sweep({"non-causal", false, [&](const std::string&) { c.non_causal_only = true; }}),
      problem(size_flag("batch", &s.batch)),
      problem(size_flag("seqlen", &seqlen)),
      problem(size_flag("seqlen-q", &seqlen_q)),
      problem(size_flag("seqlen-k", &seqlen_k)),
      problem(size_flag("nheads", &s.nheads_q)),
      problem(size_flag("nheads-kv", &nheads_kv)),
      problem(size_flag("head-dim", &s.head_dim)),
      other({"causal", false,
             [&](const std::string&) {
               c.causal_only = true;
               s.options.causal = true;
             }}),
      other({"dtype", true, [&](const std::string& v) { c.dtype = parse_dtype("dtype", v); }}),
      other({"warmup", true,
             [&](const std::string& v) { c.options.warmup = static_cast<int>(parse_int("warmup", v, 0, kMaxCalls)); }}),
      other({"iters", true,
             [&](const std::string& v) { c.options.iters = static_cast<int>(parse_int("iters", v, 1, kMaxCalls)); }}),
      other({"seed", true,
             [&](const std::string& v) {
               c.seed = static_cast<std::uint64_t>(parse_int("seed", v, 0, std::numeric_limits<std::int64_t>::max()));
             }}),
      other({"dry-run", false, [&](const std::string&) { c.dry_run = true; }}),
      {"show", false, [&](const std::string&) { c.show = true; }},
  };
  apply_flags(args, flags);

  if (c.show && !c.flags.empty()) {
    throw UsageError("--show lists the cache and takes no other option, got " + c.flags.front());
  }
  if (!c.sweep_flags.empty() && !c.problem_flags.empty()) {
    throw UsageError(c.problem_flags.front() + " (one problem) and " + c.sweep_flags.front() +
                     " (a sweep) do not go together");
  }
  if (c.dtype == DType::kFloat32) throw UsageError("--dtype fp32 has no GPU kernels to tune (use bf16 or fp16)");
  s.seqlen_q = seqlen_q.value_or(seqlen);
  s.seqlen_k = seqlen_k.value_or(seqlen);
  s.nheads_kv = nheads_kv.value_or(s.nheads_q);
  s.dtype = c.dtype;
  if (s.nheads_q % s.nheads_kv != 0) {
    throw UsageError("--nheads-kv " + std::to_string(s.nheads_kv) + " must divide --nheads " +
                     std::to_string(s.nheads_q));
  }
  return c;
}

// "1 entry", "3 entries".
std::string entries_text(std::size_t n) { return std::to_string(n) + (n == 1 ? " entry" : " entries"); }

// The label of a problem in the table: its class, or its shape when the library refuses it.
std::string label_for(const ForwardArgs& args, const AttentionShape& shape) {
  TuneClass cls;
  return tune_class(args, &cls).is_ok() ? cls.describe() : shape.describe();
}

int show_cache() {
  TuneKey key;
  const Status keyed = current_tune_key(&key);
  if (!keyed.is_ok()) throw RunError("--show: " + keyed.message());
  const std::string path = tune_cache_path(key);
  std::printf("fa3 tune --show: %s\ncache: %s\n", key.describe().c_str(),
              path.empty() ? "(no location)" : path.c_str());
  std::vector<TuneEntry> entries;
  const Status read = read_tune_cache(path, key, &entries);
  if (!read.is_ok()) throw RunError(read.message() + "; fa3::forward ignores this cache");
  if (entries.empty()) {
    std::printf("no entries (`fa3 tune` adds them)\n");
    return kExitOk;
  }
  std::fputs(cache_table(entries).c_str(), stdout);
  std::printf("%s\n", entries_text(entries.size()).c_str());
  const Status built = check_kernels_built(entries, built_forward_kernels);
  if (!built.is_ok()) throw RunError(built.message() + "; fa3::forward ignores this cache");
  return kExitOk;
}

}  // namespace

int tune_command(const std::vector<std::string>& args) {
  const TuneConfig config = parse_tune(args);
  if (config.show) return show_cache();
  const std::vector<AttentionShape> shapes =
      config.problem_flags.empty() ? sweep_shapes(config) : std::vector<AttentionShape>{config.shape};

  const std::string unusable = gpu_unusable_reason(current_device());
  if (!unusable.empty()) throw RunError("tuning times the GPU kernels, which cannot run here: " + unusable);
  TuneKey key;
  throw_if_error(current_tune_key(&key));

  TensorCapacity capacity;
  for (const AttentionShape& s : shapes) capacity.grow_to(s);
  const HostTensors host(capacity, config.dtype, config.seed);
  const DeviceTensors device(host);
  const CudaStream stream;
  TuneOptions options = config.options;
  options.store = false;  // stored together below, unless --dry-run

  std::printf("fa3 tune: %s; %s; %zu problems; median of %d calls of each kernel after %d warm-up\n",
              key.describe().c_str(), dtype_name(config.dtype), shapes.size(), options.iters, options.warmup);
  std::fflush(stdout);
  std::vector<TuneRow> rows;
  {
    Progress progress(shapes.size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const ForwardArgs fwd = forward_args(shapes[i], device.pointers());
      TuneRow row;
      row.label = label_for(fwd, shapes[i]);
      progress.show(i, row.label);
      const Status status = tune_forward(fwd, stream.get(), &row.result, options);
      if (!status.is_ok()) row.error = status.to_string();
      rows.push_back(row);
    }
  }
  std::fputs(tune_table(rows).c_str(), stdout);

  std::vector<TuneEntry> entries;
  bool failed = false;
  for (const TuneRow& r : rows) {
    if (r.error.empty()) {
      entries.push_back(r.result.entry);
    } else {
      std::fprintf(stderr, "fa3 tune: %s: %s\n", r.label.c_str(), r.error.c_str());
      failed = true;
    }
  }
  const std::string path = tune_cache_path(key);
  if (config.dry_run) {
    std::printf("cache: not written (--dry-run): %s\n", path.c_str());
  } else if (!entries.empty()) {
    throw_if_error(write_tune_cache(path, key, entries));
    std::printf("cache: %s added to %s\n", entries_text(entries.size()).c_str(), path.c_str());
  }
  return failed ? kExitError : kExitOk;
}

}  // namespace fa3::cli
