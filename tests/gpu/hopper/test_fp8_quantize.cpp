// The GPU kernel of fp8::quantize against its CPU oracle, fa3::cpu::quantize: the same
// e4m3 codes and scales, bit for bit, over input dtypes, head dims (each Hadamard block
// size), block sizes, sequence lengths that end mid-block, strided inputs with NaN in
// the gaps, inputs with outliers, and varlen batches.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "common/numeric.h"
#include "fa3/fp8.h"

namespace fa3::test {
namespace {

struct QuantizeCase {
  DType dtype;
  std::int64_t batch, seqlen, heads, head_dim;
  int block_rows;
  bool hadamard;
  std::int64_t row_pad = 0;  // elements of NaN after each row of the input
};

std::vector<QuantizeCase> cases() {
  std::vector<QuantizeCase> all;
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (const std::int64_t d : {64, 96, 128, 192, 256}) {
      all.push_back({dtype, 2, 1000, 3, d, 128, true, 8});
      all.push_back({dtype, 1, 129, 2, d, 64, false});
    }
  }
  all.push_back({DType::kBFloat16, 1, 1, 1, 128, 128, true});
  all.push_back({DType::kBFloat16, 3, 127, 5, 72, 128, false, 24});  // a head dim no transform takes
  all.push_back({DType::kFloat16, 1, 4224, 2, 128, 128, true});
  all.push_back({DType::kBFloat16, 2, 300, 2, 256, 7, true});
  return all;
}

TEST(Fp8QuantizeKernel, MatchesTheCpuVersionBitwise) {
  FA3_REQUIRE_HOPPER();
  std::uint64_t seed = 1;
  for (const QuantizeCase& c : cases()) {
    SCOPED_TRACE(testing::Message() << dtype_name(c.dtype) << " b" << c.batch << " s" << c.seqlen << " h" << c.heads
                                    << " d" << c.head_dim << " block " << c.block_rows << " hadamard " << c.hadamard);
    const std::int64_t row = c.head_dim + c.row_pad;
    const std::int64_t elems = c.batch * c.seqlen * c.heads * row;
    const std::size_t esize = dtype_size(c.dtype);
    std::vector<std::uint8_t> input(static_cast<std::size_t>(elems) * esize);
    std::mt19937_64 rng(seed++);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> unit(0.f, 1.f);
    for (std::int64_t i = 0; i < elems; ++i) {
      const bool gap = i % row >= c.head_dim;
      const float x = gap ? NAN : normal(rng) * (unit(rng) < 1e-3f ? 10.f : 1.f);
      numeric::store_from_float(input.data(), i, c.dtype, x);
    }
    const std::int64_t blocks = (c.seqlen + c.block_rows - 1) / c.block_rows;
    const std::int64_t codes = c.batch * c.seqlen * c.heads * c.head_dim;
    const std::int64_t scales = c.batch * c.heads * blocks;

    fp8::QuantizeArgs host;
    std::vector<std::uint8_t> host_codes(static_cast<std::size_t>(codes));
    std::vector<float> host_scales(static_cast<std::size_t>(scales));
    host.input = TensorView::strided(input.data(), c.dtype, {c.batch, c.seqlen, c.heads, c.head_dim},
                                     {c.seqlen * c.heads * row, c.heads * row, row, 1});
    host.output =
        TensorView::contiguous(host_codes.data(), DType::kFloat8E4M3, {c.batch, c.seqlen, c.heads, c.head_dim});
    host.scale = TensorView::contiguous(host_scales.data(), DType::kFloat32, {c.batch, c.heads, blocks});
    host.block_rows = c.block_rows;
    host.hadamard = c.hadamard;
    host.seed = seed * 77;
    ASSERT_TRUE(cpu::quantize(host).is_ok());

    DeviceBuffer d_in(input.size()), d_codes(static_cast<std::size_t>(codes)),
        d_scales(static_cast<std::size_t>(scales) * sizeof(float));
    FA3_CUDA_CHECK(cudaMemcpy(d_in.get(), input.data(), input.size(), cudaMemcpyHostToDevice));
    FA3_CUDA_CHECK(cudaMemset(d_codes.get(), 0x7f, d_codes.bytes()));
    FA3_CUDA_CHECK(cudaMemset(d_scales.get(), 0xff, d_scales.bytes()));
    fp8::QuantizeArgs dev = host;
    dev.input.data = d_in.get();
    dev.output.data = d_codes.get();
    dev.scale.data = d_scales.get();
    const Status st = fp8::quantize(dev, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    FA3_CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<std::uint8_t> gpu_codes = d_codes.to_host();
    const std::vector<std::uint8_t> gpu_scale_bytes = d_scales.to_host();
    std::vector<float> gpu_scales(host_scales.size());
    std::memcpy(gpu_scales.data(), gpu_scale_bytes.data(), gpu_scale_bytes.size());
    std::int64_t code_diffs = 0;
    for (std::size_t i = 0; i < host_codes.size(); ++i) code_diffs += gpu_codes[i] != host_codes[i];
    EXPECT_EQ(code_diffs, 0) << "of " << codes << " codes";
    EXPECT_EQ(0, std::memcmp(gpu_scales.data(), host_scales.data(), host_scales.size() * sizeof(float)))
        << "scales differ";
  }
}

// Repeated launches give the same bytes (no race between the CTA's warps).
TEST(Fp8QuantizeKernel, IsDeterministic) {
  FA3_REQUIRE_HOPPER();
  const std::int64_t n = 2 * 1024 * 4 * 128;
  DeviceBuffer in(n * 2), codes(n), scales(2 * 4 * 8 * sizeof(float));
  fill_normal(in.get(), DType::kBFloat16, n, 5);
  fp8::QuantizeArgs a;
  a.input = TensorView::contiguous(in.get(), DType::kBFloat16, {2, 1024, 4, 128});
  a.output = TensorView::contiguous(codes.get(), DType::kFloat8E4M3, {2, 1024, 4, 128});
  a.scale = TensorView::contiguous(scales.get(), DType::kFloat32, {2, 4, 8});
  a.hadamard = true;
  ASSERT_TRUE(fp8::quantize(a, nullptr).is_ok());
  const std::vector<std::uint8_t> first = codes.to_host(), first_scales = scales.to_host();
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(fp8::quantize(a, nullptr).is_ok());
    ASSERT_EQ(codes.to_host(), first);
    ASSERT_EQ(scales.to_host(), first_scales);
  }
}

// A varlen batch (lengths 0, 1, ending mid-block, longer than the rest, and three rows
// of no sequence holding NaN): the CPU version's codes and scales, bit for bit, its rows
// of no sequence left as they were.
TEST(Fp8QuantizeKernel, VarlenMatchesTheCpuVersionBitwise) {
  FA3_REQUIRE_HOPPER();
  const std::vector<std::int32_t> cu = {0, 300, 300, 301, 1430, 1437};
  const std::int64_t total = cu.back() + 3, heads = 3, d = 128, batch = 5;
  const int max_seqlen = 1129, block_rows = 128;
  const std::int64_t blocks = (max_seqlen + block_rows - 1) / block_rows;
  for (const bool hadamard : {false, true}) {
    SCOPED_TRACE(hadamard ? "hadamard" : "plain");
    std::vector<std::uint8_t> input(static_cast<std::size_t>(total * heads * d) * 2);
    std::mt19937_64 rng(hadamard ? 11 : 12);
    std::normal_distribution<float> normal;
    for (std::int64_t i = 0; i < total * heads * d; ++i) {
      const bool unused = i / (heads * d) >= cu.back();
      numeric::store_from_float(input.data(), i, DType::kBFloat16, unused ? NAN : normal(rng));
    }
    std::vector<std::uint8_t> host_codes(static_cast<std::size_t>(total * heads * d), 0x7f);
    std::vector<float> host_scales(static_cast<std::size_t>(batch * heads * blocks));
    std::vector<std::int32_t> host_cu = cu;
    fp8::QuantizeArgs host;
    host.input = TensorView::contiguous(input.data(), DType::kBFloat16, {total, heads, d});
    host.output = TensorView::contiguous(host_codes.data(), DType::kFloat8E4M3, {total, heads, d});
    host.scale = TensorView::contiguous(host_scales.data(), DType::kFloat32, {batch, heads, blocks});
    host.block_rows = block_rows;
    host.hadamard = hadamard;
    host.seed = 21;
    host.cu_seqlens = TensorView::contiguous(host_cu.data(), DType::kInt32, {batch + 1});
    host.max_seqlen = max_seqlen;
    ASSERT_TRUE(cpu::quantize(host).is_ok());

    DeviceBuffer d_in(input.size()), d_codes(host_codes.size()), d_scales(host_scales.size() * sizeof(float)),
        d_cu(cu.size() * sizeof(std::int32_t));
    FA3_CUDA_CHECK(cudaMemcpy(d_in.get(), input.data(), input.size(), cudaMemcpyHostToDevice));
    FA3_CUDA_CHECK(cudaMemcpy(d_cu.get(), cu.data(), d_cu.bytes(), cudaMemcpyHostToDevice));
    FA3_CUDA_CHECK(cudaMemset(d_codes.get(), 0x7f, d_codes.bytes()));
    FA3_CUDA_CHECK(cudaMemset(d_scales.get(), 0xff, d_scales.bytes()));
    fp8::QuantizeArgs dev = host;
    dev.input.data = d_in.get();
    dev.output.data = d_codes.get();
    dev.scale.data = d_scales.get();
    dev.cu_seqlens.data = d_cu.get();
    const Status st = fp8::quantize(dev, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(d_codes.to_host() == host_codes) << "codes differ";
    const std::vector<std::uint8_t> gpu_scales = d_scales.to_host();
    EXPECT_EQ(0, std::memcmp(gpu_scales.data(), host_scales.data(), gpu_scales.size())) << "scales differ";
  }
}

}  // namespace
}  // namespace fa3::test
