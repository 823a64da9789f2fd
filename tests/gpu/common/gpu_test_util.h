// Helpers for tests that run kernels: skipping without a Hopper GPU, device buffers,
// random fills on the device, and the accuracy rule of TESTING.md.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "api/problem.h"
#include "fa3/attention.h"
#include "fa3/device.h"
#include "fa3/kernels.h"

namespace fa3::test {

#define FA3_CUDA_CHECK(expr)                                                              \
  do {                                                                                    \
    cudaError_t err_ = (expr);                                                            \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);             \
  } while (0)

// Skips (reported as skipped, never passed) when no Hopper GPU is present.
#define FA3_REQUIRE_HOPPER()                                                              \
  do {                                                                                    \
    if (!::fa3::current_device().is_hopper()) GTEST_SKIP() << "needs a Hopper GPU (sm_90)"; \
  } while (0)

// Skips (reported as skipped) when the current device has fewer than `bytes` free: a
// test of huge buffers on a smaller card (an H100's 80 GB) must not write through the
// null pointers of allocations that failed, which breaks the context for every later test.
#define FA3_REQUIRE_DEVICE_MEMORY(bytes)                                                  \
  do {                                                                                    \
    std::size_t free_ = 0, total_ = 0;                                                    \
    FA3_CUDA_CHECK(cudaMemGetInfo(&free_, &total_));                                      \
    if (free_ < static_cast<std::size_t>(bytes)) {                                        \
      GTEST_SKIP() << "needs " << ((bytes) >> 30) << " GiB of device memory, "            \
                   << (free_ >> 30) << " GiB free";                                       \
    }                                                                                     \
  } while (0)

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  std::vector<std::uint8_t> to_host() const;

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// A problem's sizes, and the shape list of TESTING.md both directions' accuracy tests
// run: seqlens paired unequal both ways, head layouts cycling MHA / GQA 8:2 / MQA 8:1.
struct Shape {
  std::int64_t batch, seqlen_q, seqlen_k, nheads_q, nheads_kv;
};
std::vector<Shape> accuracy_shapes();

// Options the general kernels run (hopper/mask_kind.h), which both directions' tests
// go through: windows on either side and both, causal with a left side, a window so
// narrow that rows of unequal sequences see no key, the softcap alone (small, where
// tanh bends most, and large) and with a window; chunked attention alone and causal,
// in chunks of whole blocks, of fewer keys than a block and of a number that is not a
// multiple of one, under a window and with the softcap. With more queries than keys the
// first queries' chunks hold no key.
struct GeneralCase {
  const char* name;
  bool causal;
  std::int64_t window_left, window_right;
  float softcap;
  int chunk = 0;  // attention_chunk
  AttentionOptions options() const;
};
std::vector<GeneralCase> general_cases();

// Device fills: standard normal values of `dtype` (deterministic in `seed`), or NaN.
void fill_normal(void* ptr, DType dtype, std::int64_t count, std::uint64_t seed);
void fill_nan(void* ptr, DType dtype, std::int64_t count);

// A tensor of shape (d0, d1, d2, d3) inside a buffer with padding: `pad` extra
// elements after each row of the last dim, `row_pad` extra rows per batch, and a
// `margin` of elements after the last one. Padding and margin hold NaN.
struct PaddedTensor {
  DeviceBuffer buffer;
  TensorView view;
  std::int64_t used_elements = 0;  // through the last element of the view
  std::int64_t total_elements = 0;
};
PaddedTensor make_tensor(DType dtype, std::int64_t d0, std::int64_t d1, std::int64_t d2, std::int64_t d3,
                         std::uint64_t seed, std::int64_t pad = 0, std::int64_t row_pad = 0,
                         std::int64_t margin = 0);

// Multiplies every element at position j of dimension 1 (the sequence) by factors[j];
// factors has one entry per position.
void scale_positions(PaddedTensor& t, const std::vector<float>& factors);

// Elements of t's buffer outside its view that are not NaN (written by someone).
std::int64_t written_outside_view(const PaddedTensor& t);

// Head dims no kernel was built for (multiples of 8 from 8 to 248, as the GPU takes
// them), up to the largest built one: each runs on the next built kernel up.
std::vector<int> unbuilt_head_dims(const std::vector<int>& built);

// Padding per row that makes a row of `head_dim` elements a whole number of 16-byte
// units (what TMA needs of the strides) with at least 8 NaN elements after it.
std::int64_t row_pad_for(std::int64_t head_dim);

// Elements from the view's first to its last element (inclusive).
std::int64_t span_elements(const TensorView& view);

// Copies the values of a device view into another of the same dtype and shape (any
// strides); elements outside `to`'s view are left alone.
void copy_values(const TensorView& from, const TensorView& to);

// Reads a view (any strides) into a dense fp32 host vector in (d0, d1, d2, d3) order.
// Copies each index of d0 separately, so that a view whose d0 stride is huge (64-bit
// offset tests) does not drag the gap between them to the host.
std::vector<float> dense_host(const TensorView& view);

// The fp32 contents of a device buffer.
std::vector<float> floats_of(const DeviceBuffer& buffer);

// max |a - b| over all elements (NaN anywhere gives +inf); `where`, if given, receives the
// index of the first element at the max (-1 when there is none or NaN gave +inf).
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, std::int64_t* where = nullptr);

struct AccuracyReport {
  double out_err = 0, out_low_err = 0;  // max|out - ref|, max|low - ref|
  double lse_err = 0, lse_low_err = 0;
  // Where out is farthest from ref (a dense index of out; -1: no difference, or NaN), with the
  // three values there, so that a failure tells a rounding flip from a wrong value.
  std::int64_t out_worst = -1;
  float worst_out = 0, worst_ref = 0, worst_low = 0;
  // Sets the out_* fields from dense out, ref and low of one size.
  void compare_out(const std::vector<float>& out, const std::vector<float>& ref, const std::vector<float>& low);
  std::string summary() const;
};

// Poisons args.out / args.lse with NaN, runs fa3::forward (or the forward kernel
// named `kernel`; either must succeed), runs the CUDA reference in fp32 and in the
// inputs' precision, and compares.
AccuracyReport check_forward(const ForwardArgs& args, const std::string& kernel = "");

// The forward kernels built for args' dtype, head dim and mask (fa3::forward_kernels).
std::vector<std::string> kernels_for(const ForwardArgs& args);

// The forward accuracy rule: max|out-ref| <= 2 max|low-ref| + 1e-5 and an absolute
// cap (bf16 2e-2, fp16 4e-3); NaN never passes.
::testing::AssertionResult forward_accurate(const AccuracyReport& r, DType dtype);

// dq, dk and dv of a backward call, in that order, with their names.
constexpr int kGradients = 3;
constexpr const char* kGradientNames[kGradients] = {"dq", "dk", "dv"};
std::array<const TensorView*, kGradients> gradient_views(const BackwardArgs& args);

// The backward reference for args' inputs (q, k, v, dout; out and lse are recomputed),
// dense fp32 in (batch, seqlen, nheads, head_dim) order: `ref` accumulated in fp32, `low`
// rounded like the inputs (reference::cuda_backward).
struct GradientReference {
  std::array<std::vector<float>, kGradients> ref, low;
  std::vector<float> dsinks_ref;  // when args.dsinks is given
};
GradientReference backward_reference(const BackwardArgs& args);

// Per gradient: max|out - ref|, max|low - ref| and max|ref| (NaN anywhere gives +inf).
struct BackwardReport {
  std::array<double, kGradients> err{}, low_err{}, ref_max{};
  bool has_dsinks = false;                        // args.dsinks given (backward_accurate says how it is checked)
  double dsinks_err = 0, dsinks_max = 0;          // against the exact reference
  double dsinks_own_err = 0, dsinks_own_max = 0;  // against the formula on this call's out and lse
  std::string summary() const;
};

// Compares args.dq, dk and dv as they are now with `ref`.
BackwardReport compare_backward(const BackwardArgs& args, const GradientReference& ref);

// Poisons args.dq, dk and dv with NaN, runs fa3::backward (which must succeed) on the
// default stream, and compares with a fresh reference.
BackwardReport check_backward(const BackwardArgs& args);

// The backward accuracy rule, for each of dq, dk and dv: max|out-ref| <= 3 max|low-ref|
// + 1e-5, and a cap of backward_cap(dtype) * max(1, max|ref|); NaN never passes.
//
// The cap scales with the gradient because, unlike O, gradients are sums over whole
// sequences: dv of the one key that 1025 queries of 8 heads see reaches ~300, where
// storing it in 16 bits alone errs by ~0.5. Over the shape list the low reference
// strays by up to 1.3e-2 (bf16) and 2.4e-3 (fp16) of max(1, max|ref|); the caps, 3e-2
// and 6e-3, let a kernel be twice as far off where that is largest, while a missing or
// doubled term errs by a large part of the gradient.
double backward_cap(DType dtype);
::testing::AssertionResult backward_accurate(const BackwardReport& r, DType dtype);

}  // namespace fa3::test
