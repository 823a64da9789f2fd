#include "common/gpu_test_util.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <sstream>

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

std::vector<float> dense_host(const TensorView& v) {
  std::vector<std::uint8_t> raw(static_cast<std::size_t>(span_elements(v)) * dtype_size(v.dtype));
  if (cudaMemcpy(raw.data(), v.data, raw.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
    ADD_FAILURE() << "cudaMemcpy to host failed";
    return {};
  }
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  std::int64_t shape[4] = {1, 1, 1, 1}, stride[4] = {0, 0, 0, 0};
  for (int d = 0; d < v.rank; ++d) {
    shape[4 - v.rank + d] = v.shape[d];
    stride[4 - v.rank + d] = v.stride[d];
  }
  std::size_t i = 0;
  for (std::int64_t a = 0; a < shape[0]; ++a)
    for (std::int64_t b = 0; b < shape[1]; ++b)
      for (std::int64_t c = 0; c < shape[2]; ++c)
        for (std::int64_t d = 0; d < shape[3]; ++d)
          out[i++] = numeric::load_as_float(raw.data(), a * stride[0] + b * stride[1] + c * stride[2] + d * stride[3],
                                            v.dtype);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) {
      // Equal infinities (lse -inf of empty rows) agree; anything else NaN fails.
      if (a[i] == b[i]) continue;
      return INFINITY;
    }
    m = std::max(m, d);
  }
  return m;
}

std::string AccuracyReport::summary() const {
  std::ostringstream s;
  s << "out err " << out_err << " (low " << out_low_err << "), lse err " << lse_err << " (low " << lse_low_err << ")";
  return s.str();
}

std::vector<std::string> kernels_for(const ForwardArgs& args) {
  std::vector<std::string> names;
  const Status st = forward_kernels(args, &names);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_FALSE(names.empty());
  return names;
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
  EXPECT_TRUE(reference::cuda_forward(p, args.q, args.k, args.v, static_cast<float*>(ref_out.get()),
                                      static_cast<float*>(ref_lse.get()), reference::Precision::kExact, nullptr)
                  .is_ok());
  EXPECT_TRUE(reference::cuda_forward(p, args.q, args.k, args.v, static_cast<float*>(low_out.get()),
                                      static_cast<float*>(low_lse.get()), reference::Precision::kLikeInputs, nullptr)
                  .is_ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  auto as_floats = [](const DeviceBuffer& b) {
    auto raw = b.to_host();
    std::vector<float> f(raw.size() / 4);
    std::memcpy(f.data(), raw.data(), f.size() * 4);
    return f;
  };
  const std::vector<float> out = dense_host(args.out);
  const std::vector<float> ref = as_floats(ref_out), low = as_floats(low_out);
  r.out_err = max_abs_diff(out, ref);
  r.out_low_err = max_abs_diff(low, ref);
  if (args.lse.data != nullptr) {
    const std::vector<float> lse = dense_host(args.lse);
    const std::vector<float> rl = as_floats(ref_lse), ll = as_floats(low_lse);
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

}  // namespace fa3::test
