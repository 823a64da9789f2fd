#include "hopper/fwd_dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/status_macros.h"
#include "hopper/fp8_vt.h"
#include "hopper/varlen_rows.h"

namespace fa3::hopper {

// One launcher per compiled (dtype, head dims, mask, tile), defined in generated files;
// `id` names the head dims: "128", or "192v128" for a V head dim of its own.
#define FA3_FWD_INSTANCE(dtype, hdim, hdim_v, id, mask, bm, bn, ostore, ostore_kind, stages, qstages, cluster) \
  Status fwd_##dtype##_hdim##id##_##mask##_##bm##x##bn##_##ostore##_##stages##_##qstages##_##cluster(        \
      const FwdParams&, cudaStream_t);
#include "fwd_registry.inc"
#undef FA3_FWD_INSTANCE

namespace {

// A kernel's dtype name: bf16 or fp16, or e4m3bf16 / e4m3fp16 for e4m3 inputs and O's
// 16-bit type. (Used by the registry's entries, of which a build may have none.)
[[maybe_unused]] DType dtype_from_name(const char* name) {
  const std::string n = name;
  if (n.rfind("e4m3", 0) == 0) return DType::kFloat8E4M3;
  return n == "fp16" ? DType::kFloat16 : DType::kBFloat16;
}
[[maybe_unused]] DType out_dtype_from_name(const char* name) {
  const std::string n = name;
  return n == "fp16" || n == "e4m3fp16" ? DType::kFloat16 : DType::kBFloat16;
}
bool is_fp8(const FwdKernelEntry& k) { return k.dtype == DType::kFloat8E4M3; }

// The Q/K head dims of the e4m3 kernels (fp8) or of the 16-bit ones, ascending.
std::vector<int> head_dims_of_family(bool fp8) {
  std::vector<int> out;
  for (const FwdKernelEntry& k : fwd_kernels()) {
    if (is_fp8(k) == fp8 && std::find(out.begin(), out.end(), k.head_dim) == out.end()) out.push_back(k.head_dim);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The kernel family that runs a call on the kernels of QK head dim `head_dim` (FP8 ones
// with `fp8`): its mask kind's, except that a varlen call needs a family that carries the
// varlen paths, the general one where the tuned plain and causal kernels do not
// (fwd_family_carries_varlen).
MaskKind fwd_mask_kind(const Problem& p, int head_dim, bool fp8 = false) {
  const MaskKind kind = mask_kind(p);
  if (p.varlen && !fwd_family_carries_varlen(head_dim, kind == MaskKind::kGeneral, fp8)) return MaskKind::kGeneral;
  return kind;
}

// The dispatcher's order of preference among tile shapes, best first; kernels whose
// shape is not listed keep the build's order after these. Chosen by measurement
// (docs/perf-log.md).
// `head_dim` is the kernel's (fwd_kernel_head_dims), which the measurements are of.
std::vector<FwdTile> preferred_tiles(const Problem& p, int head_dim) {
  const MaskKind kind = fwd_mask_kind(p, head_dim);
  if (kind == MaskKind::kGeneral) return {};  // one tile per head dim
  if (head_dim == 64 && p.seqlen_k <= 1024) {
    // Short rows of keys: a tile is a few key blocks, so its fixed cost weighs most,
    // and four warpgroups of 64-key blocks overlap it better than three of 128
    // (+7-10 % at 512-1k tokens, both masks; behind from 2k, where 64-key blocks cost
    // more per key than they save per tile).
    return {{256, 64}, {192, 128}};
  }
  if (kind == MaskKind::kPlain && p.seqlen_k >= 4096 && head_dim >= 96) {
    // Long rows of keys: CTA pairs sharing each K/V load halve the L2 traffic that
    // costs clock under the power cap (+1-3 % from 4k keys at head dims 96-256, level
    // at hdim 192 4k); on shorter rows running in step costs more than that saves
    // (512-1k: 1-5 % behind). Head dim 64 gained nothing from pairs. The paired
    // tile is whichever one the build compiled for the head dim.
    for (const FwdKernelEntry& k : fwd_kernels()) {
      if (k.head_dim == head_dim && k.mask == MaskKind::kPlain && k.tile.cluster > 1) return {k.tile};
    }
  }
  if (kind == MaskKind::kPlain && head_dim == 256) {
    // A row's last key block is cut off at the sequence end but costs a whole one.
    // 64-key blocks cost about 3 % more per key than 80-key ones (2-6 % in the
    // measurements) and pad less at some lengths: 512 keys are 7 blocks of 80 (9 %
    // padding) or 8 of 64, and 64 ran 3 % faster; at 1k and 2k 80 pads 1.6 % and ran
    // 1-2 % faster (docs/perf-log.md). So the tile with less padded work wins.
    // (Causal rows keep 128x64, the build's only causal tile at this head dim.)
    const auto padded = [&](int block_n) { return (p.seqlen_k + block_n - 1) / block_n * block_n; };
    const bool narrow = padded(64) * 1.03 < padded(80);
    return narrow ? std::vector<FwdTile>{{128, 64}, {128, 80}} : std::vector<FwdTile>{{128, 80}, {128, 64}};
  }
  return {};
}

// The same for FP8 kernels. Head dim 128's plain calls have a 128x224 tile beside
// 128x128 (src/CMakeLists.txt's FA3_FP8_FWD_TILES_128): from 2k keys its wider blocks
// spread each block's fixed cost over more scores (with the lean softmax, +3 to +22 %
// over the 128x128 tile without it, on an H100), but rows of up to 1k keys are a few
// blocks, padded to 224, and ran 22 % (512) and 3 % (1k) slower (docs/perf-log.md).
// Calls with block scales never see the wide tile. Head dim 192's 128x160 tile, plain
// and causal, gained 3-10 % over 128x128 from 2k keys and lost 4-15 % at 512 and 1k
// (H100, docs/perf-log.md): rows of up to 1k keys keep 128x128. Head dim 256's 128x128
// ran 1-3 % ahead of 128x64 without a mask and up to 2.6 % ahead causal from 2k keys,
// but causal rows of 512 and 1k keys lost 7 % and 1 % on it (H100): they keep 128x64.
std::vector<FwdTile> preferred_fp8_tiles(const Problem& p, int head_dim) {
  if (head_dim == 128 && fwd_mask_kind(p, head_dim, true) == MaskKind::kPlain && p.seqlen_k <= 1024) {
    return {{128, 128}};
  }
  if (head_dim == 192 && p.seqlen_k <= 1024) return {{128, 128}};
  if (head_dim == 256 && fwd_mask_kind(p, head_dim, true) == MaskKind::kCausal && p.seqlen_k <= 1024) {
    return {{128, 64}};
  }
  return {};
}

}  // namespace

std::string FwdKernelEntry::name() const {
  // What the build's tile list forced is part of the name, in the list's syntax.
  std::string name = std::to_string(tile.block_m) + "x" + std::to_string(tile.block_n);
  if (tile.o_store != OStore::kAuto) {
    name += tile.o_store == OStore::kOwnBuffer ? "-os" : tile.o_store == OStore::kQBuffer ? "-oq" : "-or";
  }
  if (tile.stages != 0) name += "-kv" + std::to_string(tile.stages);
  if (tile.q_stages != 0) name += "-q" + std::to_string(tile.q_stages);
  if (tile.cluster > 1) name += "-c" + std::to_string(tile.cluster);
  return name;
}

bool FwdKernelEntry::takes_fp8_block_scales() const {
  return kFp8BlockRows % tile.block_m == 0 && kFp8BlockRows % tile.block_n == 0;
}

const std::vector<FwdKernelEntry>& fwd_kernels() {
  static const std::vector<FwdKernelEntry> kernels = {
#define FA3_FWD_INSTANCE(dtype, hdim, hdim_v, id, mask, bm, bn, ostore, ostore_kind, stages, qstages, cluster) \
  {dtype_from_name(#dtype),                                                                                   \
   out_dtype_from_name(#dtype),                                                                               \
   hdim,                                                                                                      \
   hdim_v,                                                                                                    \
   mask_kind_from_name(#mask),                                                                                \
   {bm, bn, OStore::ostore_kind, stages, qstages, cluster},                                                   \
   &fwd_##dtype##_hdim##id##_##mask##_##bm##x##bn##_##ostore##_##stages##_##qstages##_##cluster},
#include "fwd_registry.inc"
#undef FA3_FWD_INSTANCE
  };
  return kernels;
}

std::vector<DType> fwd_dtypes() {
  std::vector<DType> out;
  for (const FwdKernelEntry& k : fwd_kernels()) {
    if (!is_fp8(k) && std::find(out.begin(), out.end(), k.dtype) == out.end()) out.push_back(k.dtype);
  }
  return out;
}

std::vector<int> fwd_head_dims() { return head_dims_of_family(false); }

std::vector<int> fwd_fp8_head_dims() { return head_dims_of_family(true); }

HeadDims fwd_kernel_head_dims(std::int64_t d, std::int64_t dv) { return fwd_kernel_head_dims(d, dv, false); }

HeadDims fwd_kernel_head_dims(std::int64_t d, std::int64_t dv, bool fp8) {
  HeadDims best;
  for (const FwdKernelEntry& k : fwd_kernels()) {
    const bool fits = is_fp8(k) == fp8 && k.head_dim >= d && k.head_dim_v >= dv;
    if (fits && (best.qk == 0 || k.head_dim + k.head_dim_v < best.qk + best.v)) best = {k.head_dim, k.head_dim_v};
  }
  return best;
}

std::vector<const FwdKernelEntry*> fwd_candidates(const Problem& p, DType dtype) {
  return fwd_candidates(p, dtype, dtype == DType::kFloat8E4M3 ? DType::kBFloat16 : dtype);
}

std::vector<const FwdKernelEntry*> fwd_candidates(const Problem& p, DType dtype, DType out_dtype) {
  const HeadDims dims = fwd_kernel_head_dims(p.head_dim, p.head_dim_v, dtype == DType::kFloat8E4M3);
  std::vector<const FwdKernelEntry*> out;
  for (const FwdKernelEntry& k : fwd_kernels()) {
    if (k.dtype == dtype && k.out_dtype == out_dtype && k.head_dim == dims.qk && k.head_dim_v == dims.v &&
        k.mask == fwd_mask_kind(p, dims.qk, is_fp8(k)) && (!p.fp8_block_scales || k.takes_fp8_block_scales())) {
      out.push_back(&k);
    }
  }
  // The measurements behind the preferences are of equal head dims.
  const bool fp8 = dtype == DType::kFloat8E4M3;
  const std::vector<FwdTile> order = dims.qk != dims.v ? std::vector<FwdTile>{}
                                     : fp8             ? preferred_fp8_tiles(p, dims.qk)
                                                       : preferred_tiles(p, dims.qk);
  auto rank = [&](const FwdKernelEntry* k) {
    const auto it = std::find_if(order.begin(), order.end(), [&](FwdTile t) {
      return t.block_m == k->tile.block_m && t.block_n == k->tile.block_n &&
             std::max(t.cluster, 1) == std::max(k->tile.cluster, 1);
    });
    return it - order.begin();
  };
  std::stable_sort(out.begin(), out.end(), [&](auto* a, auto* b) { return rank(a) < rank(b); });
  return out;
}

bool fwd_varlen_enabled() { return kVarlenKernels; }

bool fwd_fp8_varlen_enabled() { return fwd_fp8_enabled() && kFp8VarlenKernels; }

bool fwd_fp8_enabled() {
#ifdef FA3_GPU_FP8
  return true;
#else
  return false;
#endif
}

bool fwd_fp8_vt_in_smem() { return kFp8VtInSmem; }

std::size_t fwd_workspace_bytes(const Problem& p, DType dtype) {
  return dtype == DType::kFloat8E4M3 && !kFp8VtInSmem ? fp8_vt_bytes(p) : 0;
}

namespace {

// A fixed-length call's tensors: (batch, seqlen, nheads, dim) and lse (batch, nheads,
// seqlen).
void set_padded_layout(const ForwardArgs& a, FwdParams* f) {
  f->q_batch_stride = a.q.stride[0];
  f->q_row_stride = a.q.stride[1];
  f->q_head_stride = a.q.stride[2];
  f->k_batch_stride = a.k.stride[0];
  f->k_row_stride = a.k.stride[1];
  f->k_head_stride = a.k.stride[2];
  f->v_batch_stride = a.v.stride[0];
  f->v_row_stride = a.v.stride[1];
  f->v_head_stride = a.v.stride[2];
  f->o_batch_stride = a.out.stride[0];
  f->o_row_stride = a.out.stride[1];
  f->o_head_stride = a.out.stride[2];
  if (a.lse.data != nullptr) {
    f->lse_batch_stride = a.lse.stride[0];
    f->lse_head_stride = a.lse.stride[1];
    f->lse_row_stride = a.lse.stride[2];
  }
}

// A varlen call's packed tensors: (total, nheads, dim) and lse (nheads, total), no batch
// stride (the kernels see one batch entry of all the rows).
void set_packed_layout(const Problem& p, const ForwardArgs& a, FwdParams* f) {
  f->q_row_stride = a.q.stride[0];
  f->q_head_stride = a.q.stride[1];
  f->k_row_stride = a.k.stride[0];
  f->k_head_stride = a.k.stride[1];
  f->v_row_stride = a.v.stride[0];
  f->v_head_stride = a.v.stride[1];
  f->o_row_stride = a.out.stride[0];
  f->o_head_stride = a.out.stride[1];
  if (a.lse.data != nullptr) {
    f->lse_head_stride = a.lse.stride[0];
    f->lse_row_stride = a.lse.stride[1];
  }
  f->cu_seqlens_q = static_cast<const int*>(a.varlen.cu_seqlens_q.data);
  f->cu_seqlens_k = static_cast<const int*>(a.varlen.cu_seqlens_k.data);
  f->seqused_q = static_cast<const int*>(a.varlen.seqused_q.data);
  f->seqused_k = static_cast<const int*>(a.varlen.seqused_k.data);
  f->total_q = static_cast<int>(p.total_q);
  f->total_k = static_cast<int>(p.total_k);
}

// An FP8 call's scales; a view's strides as (batch, head[, block]).
void set_fp8_scales(const Fp8Args& a, FwdParams* f) {
  const auto scale = [](const TensorView& t) {
    FwdParams::Fp8Scale s;
    s.ptr = static_cast<const float*>(t.data);
    if (s.ptr != nullptr) {
      s.batch_stride = t.stride[0];
      s.head_stride = t.stride[1];
      s.block_stride = t.rank > 2 ? t.stride[2] : 0;
    }
    return s;
  };
  f->q_descale = scale(a.q_descale);
  f->k_descale = scale(a.k_descale);
  f->v_descale = scale(a.v_descale);
  f->q_block_scale = scale(a.q_block_scale);
  f->k_block_scale = scale(a.k_block_scale);
  f->v_block_scale = scale(a.v_block_scale);
}

}  // namespace

FwdParams make_fwd_params(const Problem& p, const ForwardArgs& a, int num_sms) {
  FwdParams f;
  f.q = a.q.data;
  f.k = a.k.data;
  f.v = a.v.data;
  f.out = a.out.data;
  f.lse = static_cast<float*>(a.lse.data);
  f.sinks = static_cast<const float*>(a.sinks.data);
  f.sinks_stride = a.sinks.data != nullptr ? a.sinks.stride[0] : 0;
  if (p.varlen) {
    set_packed_layout(p, a, &f);
  } else {
    set_padded_layout(a, &f);
  }
  f.batch = static_cast<int>(p.batch);
  f.seqlen_q = static_cast<int>(p.seqlen_q);
  f.seqlen_k = static_cast<int>(p.seqlen_k);
  f.nheads_q = static_cast<int>(p.nheads_q);
  f.nheads_kv = static_cast<int>(p.nheads_kv);
  f.head_dim = static_cast<int>(p.head_dim);
  f.head_dim_v = static_cast<int>(p.head_dim_v);
  f.softmax_scale = p.softmax_scale;
  f.softmax_scale_log2 = p.softmax_scale * static_cast<float>(M_LOG2E);
  f.softcap = p.softcap;
  set_mask_params(p, &f);
  if (a.q.dtype == DType::kFloat8E4M3) {
    f.v_col_stride = a.v.stride[a.v.rank - 1];
    set_fp8_scales(a.fp8, &f);
    f.vt_keys = static_cast<int>(std::min<std::int64_t>(fp8_vt_keys(p), INT32_MAX));
  }
  f.num_sms = num_sms;
  return f;
}

// Runs `kernel` on an FP8 call: Vᵀ into the caller's workspace, then the kernel (which,
// built to transpose V in shared memory, reads V itself).
Status run_fp8(const Problem& p, const FwdKernelEntry& kernel, FwdParams params, void* workspace,
               cudaStream_t stream) {
  if (kFp8VtInSmem) return kernel.launch(params, stream);
  // Vᵀ's columns are ints in the kernels, a varlen call's sequences padded (fp8_vt.h).
  if (fp8_vt_keys(p) > INT32_MAX) {
    return {StatusCode::kInvalidArgument, "k: too many keys for V's transpose: " + std::to_string(fp8_vt_keys(p)) +
                                              " columns with the sequences' padding, at most 2^31 - 1"};
  }
  const cudaError_t err = launch_fp8_transpose_v(params, workspace, stream);
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("FP8 forward: transpose of V: ") + cudaGetErrorString(err)};
  }
  params.vt = workspace;
  return kernel.launch(params, stream);
}

int fwd_widest_head_dim_v(bool fp8) {
  int widest = 0;
  for (const FwdKernelEntry& k : fwd_kernels()) {
    if (is_fp8(k) == fp8) widest = std::max(widest, k.head_dim_v);
  }
  return widest;
}

namespace {

// Columns [first, first + width) of a tensor's last dimension: the same strides, the
// data pointer moved (whole 16-byte units when the row is, as every slice here is: the
// slices start at multiples of a kernel's V head dim).
TensorView column_slice(const TensorView& t, std::int64_t first, std::int64_t width) {
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + first * static_cast<std::int64_t>(dtype_size(t.dtype));
  s.shape[t.rank - 1] = width;
  return s;
}

// A V head dim wider than every built kernel's, as slices of V's (and out's) columns of
// the widest, each run as a call of its own on the kernel that fits it. The softmax
// does not depend on V, so each slice's output is exactly those columns of the whole
// output; what repeats is Q·Kᵀ and the softmax: at (64, 512) on the (64, 256) kernel,
// 2 x 64 + 512 head-dim units of work where one pass would do 64 + 512 (11 % more). The
// lse, the same in every slice, is written by the first.
Status run_forward_sliced(const Problem& p, const ForwardArgs& a, int widest, int num_sms, cudaStream_t stream) {
  for (std::int64_t first = 0; first < p.head_dim_v; first += widest) {
    Problem slice = p;
    slice.head_dim_v = std::min<std::int64_t>(widest, p.head_dim_v - first);
    ForwardArgs sa = a;
    sa.v = column_slice(a.v, first, slice.head_dim_v);
    sa.out = column_slice(a.out, first, slice.head_dim_v);
    if (first > 0) sa.lse = TensorView{};
    FA3_RETURN_IF_ERROR(run_forward(slice, sa, num_sms, stream));
  }
  return Status::ok();
}

}  // namespace

Status run_forward(const Problem& p, const ForwardArgs& a, int num_sms, cudaStream_t stream, const char* kernel) {
  const int widest_v = fwd_widest_head_dim_v(a.q.dtype == DType::kFloat8E4M3);
  if (widest_v > 0 && p.head_dim_v > widest_v) {
    if (kernel != nullptr) {
      return {StatusCode::kInvalidArgument, "kernel '" + std::string(kernel) + "': v's head dim " +
                                                std::to_string(p.head_dim_v) + " is wider than any kernel's (" +
                                                std::to_string(widest_v) +
                                                "); fa3::forward runs it in column slices, each on its own kernel"};
    }
    return run_forward_sliced(p, a, widest_v, num_sms, stream);
  }
  const std::vector<const FwdKernelEntry*> candidates = fwd_candidates(p, a.q.dtype, a.out.dtype);
  const bool fp8 = a.q.dtype == DType::kFloat8E4M3;
  const int kernel_head_dim = fwd_kernel_head_dims(p.head_dim, p.head_dim_v, fp8).qk;
  const std::string mask = mask_kind_name(fwd_mask_kind(p, kernel_head_dim, fp8));
  const std::string dtype = fp8 ? std::string(dtype_name(a.q.dtype)) + " (out " + dtype_name(a.out.dtype) + ")"
                                : std::string(dtype_name(a.q.dtype));
  const std::string dims = p.head_dim_v == p.head_dim ? "head dim " + std::to_string(p.head_dim)
                                                      : "head dims (q/k, v) (" + std::to_string(p.head_dim) + ", " +
                                                            std::to_string(p.head_dim_v) + ")";
  if (candidates.empty()) {
    return {StatusCode::kNotSupported,
            "no forward kernel was built for dtype " + dtype + ", " + dims + ", mask " + mask};
  }
  const FwdKernelEntry* chosen = candidates.front();
  if (kernel != nullptr) {
    const auto it = std::find_if(candidates.begin(), candidates.end(), [&](auto* k) { return k->name() == kernel; });
    if (it == candidates.end()) {
      std::string names;
      for (const FwdKernelEntry* k : candidates) names += (names.empty() ? "" : ", ") + k->name();
      return {StatusCode::kInvalidArgument, std::string("no forward kernel '") + kernel + "' for dtype " + dtype +
                                                ", " + dims + ", mask " + mask + " (built: " + names + ")"};
    }
    chosen = *it;
  }
  const FwdParams params = make_fwd_params(p, a, num_sms);
  const Status launched = fp8 ? run_fp8(p, *chosen, params, a.workspace, stream) : chosen->launch(params, stream);
  if (!launched.is_ok()) return launched;
  // A varlen call's rows of no sequence (hopper/varlen_rows.h); nothing otherwise.
  return launch_clear_unused_rows(params, static_cast<int>(dtype_size(a.out.dtype)), stream);
}

}  // namespace fa3::hopper
