#include <exception>
#include <new>
#include <string>
#include <vector>

#include "api/validate.h"
#include "api/validate_kvcache.h"
#include "api/validate_merge.h"
#include "common/numeric.h"
#include "common/status_macros.h"
#include "fa3/cpu.h"
#include "reference/combine.h"
#include "reference/kvcache.h"
#include "reference/merge.h"
#include "reference/naive.h"
#include "reference/tiled_cpu.h"
#include "reference/varlen.h"

namespace fa3::cpu {
namespace {

Status check_options(const Options& o) {
  if (o.num_threads >= 0) return Status::ok();
  return {StatusCode::kInvalidArgument,
          "num_threads must be >= 0 (0: one per hardware thread), got " + std::to_string(o.num_threads)};
}

// Runs `body` and reports any exception as a Status: none may cross the public API.
template <typename Body>
Status run_guarded(const char* entry, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return {StatusCode::kInternal, std::string(entry) + ": out of host memory"};
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, std::string(entry) + ": " + e.what()};
  } catch (...) {
    return {StatusCode::kInternal, std::string(entry) + ": unknown exception"};
  }
}

// Writes a result held in the canonical contiguous (batch, seqlen, nheads, head_dim)
// layout into the caller's view, in its dtype and strides.
void store(const TensorView& t, const std::vector<double>& values) {
  std::size_t n = 0;
  for (std::int64_t b = 0; b < t.shape[0]; ++b) {
    for (std::int64_t s = 0; s < t.shape[1]; ++s) {
      for (std::int64_t h = 0; h < t.shape[2]; ++h) {
        const std::int64_t base = b * t.stride[0] + s * t.stride[1] + h * t.stride[2];
        for (std::int64_t d = 0; d < t.shape[3]; ++d) {
          numeric::store_from_float(t.data, base + d * t.stride[3], t.dtype, static_cast<float>(values[n++]));
        }
      }
    }
  }
}

// Writes one fp32 value per query head into a (nheads_q) view of any stride.
void store_per_head(const TensorView& t, const std::vector<double>& values) {
  for (std::int64_t h = 0; h < t.shape[0]; ++h) {
    static_cast<float*>(t.data)[h * t.stride[0]] = static_cast<float>(values[static_cast<std::size_t>(h)]);
  }
}

}  // namespace

Status forward(const ForwardArgs& args, const Options& options) {
  return run_guarded("fa3::cpu::forward", [&]() -> Status {
    Problem problem;
    FA3_RETURN_IF_ERROR(validate_forward(args, cpu_target(), &problem));
    FA3_RETURN_IF_ERROR(check_options(options));
    reference::TiledCpuConfig config;
    config.num_threads = options.num_threads;
    if (problem.varlen) {
      reference::varlen_tiled_forward(problem, args, config);
    } else {
      reference::tiled_forward(problem, args, config);
    }
    return Status::ok();
  });
}

// The exact reference recomputes the forward pass, so args.out and args.lse are
// validated but not read. All gradients are computed before any output is written.
Status backward(const BackwardArgs& args, const Options& options) {
  return run_guarded("fa3::cpu::backward", [&]() -> Status {
    Problem problem;
    FA3_RETURN_IF_ERROR(validate_backward(args, cpu_target(), &problem));
    FA3_RETURN_IF_ERROR(check_options(options));
    if (problem.varlen) {
      // Gradients come back in the packed layouts, rows of no sequence included (0).
      const reference::BackwardResult grads = reference::varlen_backward(problem, args);
      store(reference::rows_view(args.dq, 0, problem.total_q), grads.dq);
      store(reference::rows_view(args.dk, 0, problem.total_k), grads.dk);
      store(reference::rows_view(args.dv, 0, problem.total_k), grads.dv);
      if (args.dsinks.defined()) store_per_head(args.dsinks, grads.dsinks);
      return Status::ok();
    }
    const reference::BackwardResult grads =
        reference::backward(problem, args.q, args.k, args.v, args.dout, reference::Precision::kExact, args.sinks);
    store(args.dq, grads.dq);
    store(args.dk, grads.dk);
    store(args.dv, grads.dv);
    if (args.dsinks.defined()) store_per_head(args.dsinks, grads.dsinks);
    return Status::ok();
  });
}

// Validation reads the index tensors first, so a rejected call appends nothing.
Status forward_with_kvcache(const KvCacheArgs& args, const Options& options) {
  return run_guarded("fa3::cpu::forward_with_kvcache", [&]() -> Status {
    KvCacheProblem problem;
    FA3_RETURN_IF_ERROR(validate_kvcache(args, cpu_target(), &problem));
    FA3_RETURN_IF_ERROR(check_options(options));
    reference::TiledCpuConfig config;
    config.num_threads = options.num_threads;
    reference::kvcache_forward(problem, args, config);
    return Status::ok();
  });
}

Status combine(const CombineArgs& args) {
  return run_guarded("fa3::cpu::combine", [&]() -> Status {
    CombineProblem problem;
    FA3_RETURN_IF_ERROR(validate_combine(args, cpu_target(), &problem));
    reference::combine(problem, args);
    return Status::ok();
  });
}

Status merge_attention_states(const MergeArgs& args) {
  return run_guarded("fa3::cpu::merge_attention_states", [&]() -> Status {
    FA3_RETURN_IF_ERROR(validate_merge(args));
    reference::merge_states(args);
    return Status::ok();
  });
}

}  // namespace fa3::cpu
