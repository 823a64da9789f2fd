#include "common/gpu_test_util.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "api/validate.h"
#include "common/numeric.h"
#include "reference/cuda_reference.h"

namespace fa3::test {
namespace {

// A counter-based generator: each element's value depends only on (seed, index).
__device__ std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

template <class T>
__device__ T from_float(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return v;
}

template <class T>
__global__ void normal_kernel(T* out, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t r = mix(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i));
    const float u1 = (static_cast<float>(r >> 40) + 1.f) * (1.f / 16777217.f);  // (0, 1]
    const float u2 = static_cast<float>((r >> 16) & 0xffffff) * (1.f / 16777216.f);
    out[i] = from_float<T>(sqrtf(-2.f * logf(u1)) * cospif(2.f * u2));
  }
}

template <class T>
__global__ void nan_kernel(T* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_float<T>(NAN);
  }
}

// x[b, j, ...] *= factors[j] over the first `n` elements of a (d0, d1, ...) tensor
// whose dimensions 0 and 1 have strides s0 and s1; rows past d1 (padding) are left.
template <class T>
__global__ void scale_positions_kernel(T* x, std::int64_t n, std::int64_t s0, std::int64_t s1, std::int64_t d1,
                                       const float* factors) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = i % s0 / s1;
    if (j < d1) x[i] = from_float<T>(static_cast<float>(x[i]) * factors[j]);
  }
}

// Shape and strides of a view padded to rank 4 at the front.
struct Dims4 {
  std::int64_t shape[4] = {1, 1, 1, 1}, stride[4] = {0, 0, 0, 0};
};

Dims4 dims4(const TensorView& v) {
  Dims4 d;
  for (int i = 0; i < v.rank; ++i) {
    d.shape[4 - v.rank + i] = v.shape[i];
    d.stride[4 - v.rank + i] = v.stride[i];
  }
  return d;
}

// Element-by-element copy between two layouts of one shape; T only carries the bits.
template <class T>
__global__ void copy_values_kernel(const T* from, T* to, std::int64_t n, Dims4 src, Dims4 dst) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rest = i, from_at = 0, to_at = 0;
    for (int d = 3; d >= 0; --d) {
      const std::int64_t idx = rest % src.shape[d];
      rest /= src.shape[d];
      from_at += idx * src.stride[d];
      to_at += idx * dst.stride[d];
    }
    to[to_at] = from[from_at];
  }
}

// max |x| (NaN gives +inf).
double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) {
    if (std::isnan(v)) return INFINITY;
    m = std::max(m, std::fabs(static_cast<double>(v)));
  }
  return m;
}

template <template <class> class Kernel, class... Args>
void launch_typed(DType dtype, void* ptr, std::int64_t n, Args... args) {
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((n + threads - 1) / threads, 65535));
  if (n <= 0) return;
  switch (dtype) {
    case DType::kBFloat16:
      Kernel<__nv_bfloat16>::launch(blocks, threads, static_cast<__nv_bfloat16*>(ptr), n, args...);
      break;
    case DType::kFloat16: Kernel<__half>::launch(blocks, threads, static_cast<__half*>(ptr), n, args...); break;
    default: Kernel<float>::launch(blocks, threads, static_cast<float*>(ptr), n, args...); break;
  }
}

template <class T>
struct NormalLaunch {
  static void launch(unsigned b, int t, T* p, std::int64_t n, std::uint64_t seed) { normal_kernel<T><<<b, t>>>(p, n, seed); }
};
template <class T>
struct ScalePositionsLaunch {
  static void launch(unsigned b, int t, T* p, std::int64_t n, std::int64_t s0, std::int64_t s1, std::int64_t d1,
                     const float* f) {
    scale_positions_kernel<T><<<b, t>>>(p, n, s0, s1, d1, f);
  }
};
template <class T>
struct NanLaunch {
  static void launch(unsigned b, int t, T* p, std::int64_t n) { nan_kernel<T><<<b, t>>>(p, n); }
};

}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
    ptr_ = nullptr;
    bytes_ = 0;
    ADD_FAILURE() << "cudaMalloc of " << bytes << " bytes failed";
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

std::vector<std::uint8_t> DeviceBuffer::to_host() const {
  std::vector<std::uint8_t> h(bytes_);
  if (bytes_ != 0 && cudaMemcpy(h.data(), ptr_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess) {
    ADD_FAILURE() << "cudaMemcpy to host failed";
  }
  return h;
}

std::vector<Shape> accuracy_shapes() {
  const std::vector<std::pair<std::int64_t, std::int64_t>> lens = {
      {1, 1},      {2, 2},       {3, 17},      {17, 3},     {113, 113},   {127, 129}, {128, 128},
      {129, 127},  {239, 799},   {799, 239},   {1023, 1024}, {1024, 1023}, {1025, 1025}, {1, 1025},
      {1025, 1},   {4224, 4224},
  };
  const std::int64_t heads[3][2] = {{4, 4}, {8, 2}, {8, 1}};
  std::vector<Shape> shapes;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    const auto& h = heads[i % 3];
    const std::int64_t batch = lens[i].first * lens[i].second > 1000000 ? 1 : 2;
    shapes.push_back({batch, lens[i].first, lens[i].second, h[0], h[1]});
  }
  return shapes;
}

std::int64_t written_outside_view(const PaddedTensor& t) {
  const TensorView flat = TensorView::contiguous(t.buffer.get(), t.view.dtype, {t.total_elements});
  const std::vector<float> all = dense_host(flat);
  const TensorView& v = t.view;
  std::int64_t written = 0;
  for (std::int64_t i = 0; i < t.total_elements; ++i) {
    const std::int64_t b = i / v.stride[0], r = (i % v.stride[0]) / v.stride[1];
    const std::int64_t h = (i % v.stride[1]) / v.stride[2], e = i % v.stride[2];
    const bool inside = b < v.shape[0] && r < v.shape[1] && h < v.shape[2] && e < v.shape[3];
    if (!inside && !std::isnan(all[static_cast<std::size_t>(i)])) ++written;
  }
  return written;
}

std::vector<int> unbuilt_head_dims(const std::vector<int>& built) {
  std::vector<int> out;
  if (built.empty()) return out;
  const int largest = *std::max_element(built.begin(), built.end());
  for (int d : {8, 24, 40, 80, 112, 160, 200, 248}) {
    if (d <= largest && std::find(built.begin(), built.end(), d) == built.end()) out.push_back(d);
  }
  return out;
}

std::int64_t row_pad_for(std::int64_t head_dim) { return (8 - head_dim % 8) % 8 + 8; }

AttentionOptions GeneralCase::options() const {
  AttentionOptions o;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = softcap;
  o.attention_chunk = chunk;
  return o;
}

std::vector<GeneralCase> general_cases() {
  return {
      {"window_100_37", false, 100, 37, 0.f},
      {"left_200", false, 200, -1, 0.f},
      {"right_60", false, -1, 60, 0.f},
      {"causal_left_130", true, 130, 0, 0.f},
      {"diagonal_only", false, 0, 0, 0.f},
      {"softcap_2", false, -1, -1, 2.f},
      {"softcap_30_causal", true, -1, 0, 30.f},
      {"softcap_5_window_256_16", false, 256, 16, 5.f},
      {"chunk_256", false, -1, -1, 0.f, 256},
      {"chunk_200_causal", true, -1, 0, 0.f, 200},
      {"chunk_48", false, -1, -1, 0.f, 48},
      {"chunk_48_causal", true, -1, 0, 0.f, 48},
      {"chunk_300_window_100_37", false, 100, 37, 0.f, 300},
      {"chunk_1000_softcap_5", false, -1, -1, 5.f, 1000},
  };
}

void fill_normal(void* ptr, DType dtype, std::int64_t count, std::uint64_t seed) {
  launch_typed<NormalLaunch>(dtype, ptr, count, seed);
}

void fill_nan(void* ptr, DType dtype, std::int64_t count) { launch_typed<NanLaunch>(dtype, ptr, count); }

void scale_positions(PaddedTensor& t, const std::vector<float>& factors) {
  ASSERT_EQ(static_cast<std::int64_t>(factors.size()), t.view.shape[1]);
  DeviceBuffer f(factors.size() * sizeof(float));
  FA3_CUDA_CHECK(cudaMemcpy(f.get(), factors.data(), factors.size() * sizeof(float), cudaMemcpyHostToDevice));
  launch_typed<ScalePositionsLaunch>(t.view.dtype, t.buffer.get(), t.used_elements, t.view.stride[0],
                                     t.view.stride[1], t.view.shape[1], static_cast<const float*>(f.get()));
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
}

PaddedTensor make_tensor(DType dtype, std::int64_t d0, std::int64_t d1, std::int64_t d2, std::int64_t d3,
                         std::uint64_t seed, std::int64_t pad, std::int64_t row_pad, std::int64_t margin) {
  PaddedTensor t;
  const std::int64_t s2 = d3 + pad;
  const std::int64_t s1 = d2 * s2;
  const std::int64_t s0 = (d1 + row_pad) * s1;
  t.used_elements = d0 * s0;
  t.total_elements = t.used_elements + margin;
  t.buffer = DeviceBuffer(static_cast<std::size_t>(t.total_elements) * dtype_size(dtype));
  t.view = TensorView::strided(t.buffer.get(), dtype, {d0, d1, d2, d3}, {s0, s1, s2, 1});
  if (pad != 0 || row_pad != 0 || margin != 0) fill_nan(t.buffer.get(), dtype, t.total_elements);
  if (pad == 0) {
    // Rows are back to back within a batch: fill each batch's rows in one go.
    for (std::int64_t b = 0; b < d0; ++b) {
      char* base = static_cast<char*>(t.buffer.get()) + b * s0 * static_cast<std::int64_t>(dtype_size(dtype));
      fill_normal(base, dtype, d1 * s1, seed * 1000003ull + static_cast<std::uint64_t>(b));
    }
  } else {
    for (std::int64_t b = 0; b < d0; ++b) {
      for (std::int64_t r = 0; r < d1; ++r) {
        for (std::int64_t h = 0; h < d2; ++h) {
          char* base = static_cast<char*>(t.buffer.get()) +
                       (b * s0 + r * s1 + h * s2) * static_cast<std::int64_t>(dtype_size(dtype));
          fill_normal(base, dtype, d3, seed * 1000003ull + static_cast<std::uint64_t>((b * d1 + r) * d2 + h));
        }
      }
    }
  }
  return t;
}

std::int64_t span_elements(const TensorView& v) {
  std::int64_t span = 1;
  for (int d = 0; d < v.rank; ++d) span += (v.shape[d] - 1) * v.stride[d];
  return span;
}

void copy_values(const TensorView& from, const TensorView& to) {
  ASSERT_EQ(from.dtype, to.dtype);
  ASSERT_EQ(from.rank, to.rank);
  for (int d = 0; d < from.rank; ++d) ASSERT_EQ(from.shape[d], to.shape[d]) << "dim " << d;
  const std::int64_t n = from.numel();
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 65535));
  if (dtype_size(from.dtype) == 2) {
    copy_values_kernel<std::uint16_t><<<blocks, 256>>>(static_cast<const std::uint16_t*>(from.data),
                                                       static_cast<std::uint16_t*>(to.data), n, dims4(from), dims4(to));
  } else {
    ASSERT_EQ(dtype_size(from.dtype), 4u);
    copy_values_kernel<std::uint32_t><<<blocks, 256>>>(static_cast<const std::uint32_t*>(from.data),
                                                       static_cast<std::uint32_t*>(to.data), n, dims4(from), dims4(to));
  }
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<float> dense_host(const TensorView& v) {
  const Dims4 d = dims4(v);
  const std::size_t elem = dtype_size(v.dtype);
  // Elements from the first to the last of one index of d0.
  std::int64_t slice_span = 1;
  for (int i = 1; i < 4; ++i) slice_span += (d.shape[i] - 1) * d.stride[i];
  std::vector<std::uint8_t> raw(static_cast<std::size_t>(slice_span) * elem);
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  std::size_t n = 0;
  for (std::int64_t a = 0; a < d.shape[0]; ++a) {
    const char* slice = static_cast<const char*>(v.data) + a * d.stride[0] * static_cast<std::int64_t>(elem);
    if (cudaMemcpy(raw.data(), slice, raw.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      ADD_FAILURE() << "cudaMemcpy to host failed";
      return {};
    }
    for (std::int64_t b = 0; b < d.shape[1]; ++b)
      for (std::int64_t c = 0; c < d.shape[2]; ++c)
        for (std::int64_t e = 0; e < d.shape[3]; ++e)
          out[n++] = numeric::load_as_float(raw.data(), b * d.stride[1] + c * d.stride[2] + e * d.stride[3], v.dtype);
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, std::int64_t* where) {
  if (where != nullptr) *where = -1;
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  std::int64_t at = -1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) {
      // Equal infinities (lse -inf of empty rows) agree; anything else NaN fails.
      if (a[i] == b[i]) continue;
      return INFINITY;
    }
    if (d > m) {
      m = d;
      at = static_cast<std::int64_t>(i);
    }
  }
  if (where != nullptr) *where = at;
  return m;
}

void AccuracyReport::compare_out(const std::vector<float>& out, const std::vector<float>& ref,
                                 const std::vector<float>& low) {
  out_err = max_abs_diff(out, ref, &out_worst);
  out_low_err = max_abs_diff(low, ref);
  if (out_worst < 0 || low.size() != out.size()) {
    out_worst = -1;
    return;
  }
  const auto i = static_cast<std::size_t>(out_worst);
  worst_out = out[i];
  worst_ref = ref[i];
  worst_low = low[i];
}

std::string AccuracyReport::summary() const {
  std::ostringstream s;
  s << "out err " << out_err << " (low " << out_low_err << "), lse err " << lse_err << " (low " << lse_low_err << ")";
  if (out_worst >= 0) {
    s.precision(9);
    s << "; out's worst element " << out_worst << ": out " << worst_out << ", ref " << worst_ref << ", low "
      << worst_low;
  }
  return s.str();
}

std::vector<std::string> kernels_for(const ForwardArgs& args) {
  std::vector<std::string> names;
  const Status st = forward_kernels(args, &names);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_FALSE(names.empty());
  return names;
}

std::vector<float> floats_of(const DeviceBuffer& b) {
  const std::vector<std::uint8_t> raw = b.to_host();
  std::vector<float> f(raw.size() / 4);
  std::memcpy(f.data(), raw.data(), f.size() * 4);
  return f;
}

AccuracyReport check_forward(const ForwardArgs& args, const std::string& kernel) {
  AccuracyReport r;
  Problem p;
  const Status valid = validate_forward(args, gpu_target(), &p);
  EXPECT_TRUE(valid.is_ok()) << valid.to_string();
  if (!valid.is_ok()) return r;

  fill_nan(args.out.data, args.out.dtype, span_elements(args.out));
  if (args.lse.data != nullptr) fill_nan(args.lse.data, DType::kFloat32, args.lse.numel());
  const Status st = kernel.empty() ? forward(args, nullptr) : forward_with_kernel(args, kernel, nullptr);
  EXPECT_TRUE(st.is_ok()) << kernel << ": " << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::size_t n_out = static_cast<std::size_t>(args.out.numel());
  const std::size_t n_lse = static_cast<std::size_t>(p.batch * p.nheads_q * p.seqlen_q);
  DeviceBuffer ref_out(n_out * 4), ref_lse(n_lse * 4), low_out(n_out * 4), low_lse(n_lse * 4);
  // The reference reads sinks densely: tests give them contiguous.
  const auto* sinks = static_cast<const float*>(args.sinks.data);
  EXPECT_TRUE(reference::cuda_forward(p, args.q, args.k, args.v, sinks, static_cast<float*>(ref_out.get()),
                                      static_cast<float*>(ref_lse.get()), reference::Precision::kExact, nullptr)
                  .is_ok());
  EXPECT_TRUE(reference::cuda_forward(p, args.q, args.k, args.v, sinks, static_cast<float*>(low_out.get()),
                                      static_cast<float*>(low_lse.get()), reference::Precision::kLikeInputs, nullptr)
                  .is_ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<float> out = dense_host(args.out);
  const std::vector<float> ref = floats_of(ref_out), low = floats_of(low_out);
  r.compare_out(out, ref, low);
  if (args.lse.data != nullptr) {
    const std::vector<float> lse = dense_host(args.lse);
    const std::vector<float> rl = floats_of(ref_lse), ll = floats_of(low_lse);
    r.lse_err = max_abs_diff(lse, rl);
    r.lse_low_err = max_abs_diff(ll, rl);
  }
  return r;
}

::testing::AssertionResult forward_accurate(const AccuracyReport& r, DType dtype) {
  const double cap = dtype == DType::kFloat16 ? 4e-3 : 2e-2;
  const bool out_ok = std::isfinite(r.out_err) && r.out_err <= 2 * r.out_low_err + 1e-5 && r.out_err <= cap;
  const bool lse_ok = std::isfinite(r.lse_err) && r.lse_err <= 2 * r.lse_low_err + 1e-5 && r.lse_err <= cap;
  if (out_ok && lse_ok) return ::testing::AssertionSuccess() << r.summary();
  return ::testing::AssertionFailure() << r.summary();
}

std::array<const TensorView*, kGradients> gradient_views(const BackwardArgs& args) {
  return {&args.dq, &args.dk, &args.dv};
}

GradientReference backward_reference(const BackwardArgs& args) {
  GradientReference r;
  // The CPU target resolves the problem exactly as the GPU's does, without asking where
  // the memory is or for a workspace.
  Problem p;
  const Status valid = validate_backward(args, cpu_target(), &p);
  EXPECT_TRUE(valid.is_ok()) << valid.to_string();
  if (!valid.is_ok()) return r;
  std::array<std::size_t, kGradients> sizes{};
  for (int g = 0; g < kGradients; ++g) sizes[g] = static_cast<std::size_t>(gradient_views(args)[g]->numel());
  const auto* sinks = static_cast<const float*>(args.sinks.data);  // contiguous in the tests
  const bool dsinks = args.dsinks.data != nullptr;
  for (reference::Precision precision : {reference::Precision::kExact, reference::Precision::kLikeInputs}) {
    std::array<DeviceBuffer, kGradients> grads;
    for (int g = 0; g < kGradients; ++g) grads[g] = DeviceBuffer(sizes[g] * 4);
    DeviceBuffer dsinks_buffer(dsinks ? static_cast<std::size_t>(p.nheads_q) * 4 : 0);
    const Status st =
        reference::cuda_backward(p, args.q, args.k, args.v, sinks, args.dout, static_cast<float*>(grads[0].get()),
                                 static_cast<float*>(grads[1].get()), static_cast<float*>(grads[2].get()),
                                 static_cast<float*>(dsinks_buffer.get()), precision, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const bool exact = precision == reference::Precision::kExact;
    auto& into = exact ? r.ref : r.low;
    for (int g = 0; g < kGradients; ++g) into[g] = floats_of(grads[g]);
    if (dsinks && exact) r.dsinks_ref = floats_of(dsinks_buffer);
  }
  return r;
}

BackwardReport compare_backward(const BackwardArgs& args, const GradientReference& ref) {
  BackwardReport r;
  for (int g = 0; g < kGradients; ++g) {
    r.err[g] = max_abs_diff(dense_host(*gradient_views(args)[g]), ref.ref[g]);
    r.low_err[g] = max_abs_diff(ref.low[g], ref.ref[g]);
    r.ref_max[g] = max_abs(ref.ref[g]);
  }
  if (args.dsinks.data != nullptr) {
    r.has_dsinks = true;
    const std::vector<float> dsinks = dense_host(args.dsinks);
    r.dsinks_err = max_abs_diff(dsinks, ref.dsinks_ref);
    r.dsinks_max = max_abs(ref.dsinks_ref);
    // The formula on this call's own out and lse, in double (tests give sinks contiguous).
    const std::int64_t b = args.q.shape[0], sq = args.q.shape[1], h = args.q.shape[2], d = args.out.shape[3];
    const std::vector<float> out = dense_host(args.out), dout = dense_host(args.dout), lse = dense_host(args.lse);
    std::vector<float> sinks(static_cast<std::size_t>(h));
    EXPECT_EQ(cudaMemcpy(sinks.data(), args.sinks.data, sinks.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> own(static_cast<std::size_t>(h), 0.f);
    for (std::int64_t hh = 0; hh < h; ++hh) {
      double sum = 0;
      const double sink = sinks[static_cast<std::size_t>(hh)];
      for (std::int64_t bb = 0; sink != -INFINITY && bb < b; ++bb) {
        for (std::int64_t i = 0; i < sq; ++i) {
          double dd = 0;
          const std::size_t row = static_cast<std::size_t>(((bb * sq + i) * h + hh) * d);
          for (std::int64_t e = 0; e < d; ++e) dd += static_cast<double>(out[row + e]) * dout[row + e];
          sum += std::exp(sink - lse[static_cast<std::size_t>((bb * h + hh) * sq + i)]) * dd;
        }
      }
      own[static_cast<std::size_t>(hh)] = static_cast<float>(-sum);
    }
    r.dsinks_own_err = max_abs_diff(dsinks, own);
    r.dsinks_own_max = max_abs(own);
  }
  return r;
}

BackwardReport check_backward(const BackwardArgs& args) {
  for (const TensorView* g : gradient_views(args)) fill_nan(g->data, g->dtype, span_elements(*g));
  if (args.dsinks.data != nullptr) fill_nan(args.dsinks.data, DType::kFloat32, span_elements(args.dsinks));
  const Status st = backward(args, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return compare_backward(args, backward_reference(args));
}

std::string BackwardReport::summary() const {
  std::ostringstream s;
  for (int g = 0; g < kGradients; ++g) {
    s << (g ? ", " : "") << kGradientNames[g] << " err " << err[g] << " (low " << low_err[g] << ", max|ref| "
      << ref_max[g] << ")";
  }
  if (has_dsinks) {
    s << ", dsinks err " << dsinks_err << " (max|ref| " << dsinks_max << "), from this call's out and lse "
      << dsinks_own_err << " (max " << dsinks_own_max << ")";
  }
  return s.str();
}

double backward_cap(DType dtype) { return dtype == DType::kFloat16 ? 6e-3 : 3e-2; }

::testing::AssertionResult backward_accurate(const BackwardReport& r, DType dtype) {
  bool ok = true;
  for (int g = 0; g < kGradients; ++g) {
    const double cap = backward_cap(dtype) * std::max(1.0, r.ref_max[g]);
    ok = ok && std::isfinite(r.err[g]) && r.err[g] <= 3 * r.low_err[g] + 1e-5 && r.err[g] <= cap;
  }
  if (r.has_dsinks) {
    // dsinks is a sum over every row of a head of exp(sink - L_i) * rowsum(dout_i * out_i),
    // and out is the forward's 16-bit output: its rounding does not cancel in that sum
    // as it does in dq, dk and dv, which leaves even an exact computation from it about
    // 1e-3 off the exact gradient (measured: within 4e-8 of the formula on the stored
    // out and lse, and 1e-3 from the exact one, all of it from out). So: the formula on
    // this call's out and lse to fp32 rounding, and the exact gradient within the cap.
    const double cap = backward_cap(dtype) * std::max(1.0, r.dsinks_max);
    const double own_bound = 1e-5 + 1e-4 * r.dsinks_own_max;
    ok = ok && std::isfinite(r.dsinks_err) && r.dsinks_own_err <= own_bound && r.dsinks_err <= cap;
  }
  if (ok) return ::testing::AssertionSuccess() << r.summary();
  return ::testing::AssertionFailure() << r.summary();
}

}  // namespace fa3::test
