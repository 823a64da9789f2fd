// fa3 — what the GPU varlen tests share: a mix of sequence lengths, the index side of
// its packed batch (cu_seqlens and seqused on the host and the device), and NaN in the
// rows no sequence uses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/gpu_test_util.h"
#include "fa3/fa3.h"
#include "reference/varlen.h"

namespace fa3::test {

// One sequence of a mix: its allocated rows and, with seqused, the rows used.
struct SeqSpec {
  std::int32_t q_rows, k_rows;
  std::int32_t q_used = -1, k_used = -1;  // -1: all rows (no seqused)
};

struct Mix {
  const char* name;
  std::vector<SeqSpec> seqs;
  bool seqused = false;
};

inline DeviceBuffer upload_int32(const std::vector<std::int32_t>& values) {
  DeviceBuffer b(values.size() * sizeof(std::int32_t));
  EXPECT_EQ(cudaMemcpy(b.get(), values.data(), b.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

// The index side of a mix's packed batch: kTailRows rows past the last sequence belong
// to none; `varlen` views the device copies (seqused only with Mix::seqused) as a call
// takes them.
struct VarlenIndex {
  static constexpr std::int64_t kTailRows = 37;
  std::vector<std::int32_t> cu_q, cu_k, used_q, used_k;
  std::int64_t total_q = 0, total_k = 0;
  int max_q = 0, max_k = 0;
  DeviceBuffer cu_q_dev, cu_k_dev, used_q_dev, used_k_dev;
  VarlenArgs varlen;

  explicit VarlenIndex(const Mix& mix) {
    cu_q.push_back(0);
    cu_k.push_back(0);
    for (const SeqSpec& s : mix.seqs) {
      cu_q.push_back(cu_q.back() + s.q_rows);
      cu_k.push_back(cu_k.back() + s.k_rows);
      used_q.push_back(s.q_used < 0 ? s.q_rows : s.q_used);
      used_k.push_back(s.k_used < 0 ? s.k_rows : s.k_used);
      max_q = std::max<int>(max_q, used_q.back());
      max_k = std::max<int>(max_k, used_k.back());
    }
    total_q = cu_q.back() + kTailRows;
    total_k = cu_k.back() + kTailRows;
    cu_q_dev = upload_int32(cu_q);
    cu_k_dev = upload_int32(cu_k);
    const std::int64_t batch = static_cast<std::int64_t>(mix.seqs.size());
    varlen.cu_seqlens_q = TensorView::contiguous(cu_q_dev.get(), DType::kInt32, {batch + 1});
    varlen.cu_seqlens_k = TensorView::contiguous(cu_k_dev.get(), DType::kInt32, {batch + 1});
    if (mix.seqused) {
      used_q_dev = upload_int32(used_q);
      used_k_dev = upload_int32(used_k);
      varlen.seqused_q = TensorView::contiguous(used_q_dev.get(), DType::kInt32, {batch});
      varlen.seqused_k = TensorView::contiguous(used_k_dev.get(), DType::kInt32, {batch});
    }
    varlen.max_seqlen_q = max_q;
    varlen.max_seqlen_k = max_k;
  }

  // The sequences as the CPU-side helpers read them (host copies of the index tensors).
  std::vector<reference::Sequence> sequences() const {
    VarlenArgs host;
    const std::int64_t batch = static_cast<std::int64_t>(used_q.size());
    host.cu_seqlens_q = TensorView::contiguous(const_cast<std::int32_t*>(cu_q.data()), DType::kInt32, {batch + 1});
    host.cu_seqlens_k = TensorView::contiguous(const_cast<std::int32_t*>(cu_k.data()), DType::kInt32, {batch + 1});
    host.seqused_q = TensorView::contiguous(const_cast<std::int32_t*>(used_q.data()), DType::kInt32, {batch});
    host.seqused_k = TensorView::contiguous(const_cast<std::int32_t*>(used_k.data()), DType::kInt32, {batch});
    return reference::varlen_sequences(host);
  }
};

// NaN in the rows of `b` (`total` rows of heads x d values of `dtype`) past each
// sequence's used ones and past the last sequence, and in the buffer's margin after them.
inline void poison_unused(DeviceBuffer& b, DType dtype, std::int64_t d, const std::vector<std::int32_t>& cu,
                          const std::vector<std::int32_t>& used, std::int64_t total, std::int64_t heads) {
  const std::int64_t row = heads * d;
  char* base = static_cast<char*>(b.get());
  const std::size_t bytes = dtype_size(dtype);
  for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
    const std::int64_t begin = cu[s] + used[s], end = cu[s + 1];
    if (end > begin) fill_nan(base + begin * row * bytes, dtype, (end - begin) * row);
  }
  fill_nan(base + cu.back() * row * bytes, dtype, (total - cu.back()) * row);
  fill_nan(base + total * row * bytes, dtype, static_cast<std::int64_t>(b.bytes() / bytes) - total * row);
}

// One sink logit per query head, spread around -1, on the device.
inline DeviceBuffer sink_logits(std::int64_t heads_q) {
  std::vector<float> host(static_cast<std::size_t>(heads_q));
  for (std::int64_t h = 0; h < heads_q; ++h) host[static_cast<std::size_t>(h)] = 0.25f * static_cast<float>(h) - 1.f;
  DeviceBuffer b(host.size() * sizeof(float));
  EXPECT_EQ(cudaMemcpy(b.get(), host.data(), b.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

}  // namespace fa3::test
