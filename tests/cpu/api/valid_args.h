// Valid forward/backward arguments over real host buffers, for tests that break one
// validation rule at a time. The buffers are real (and generously aligned) so that the
// same views can be handed to the public entry points as well as to the validators.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/validate.h"
#include "fa3/attention.h"

namespace fa3::test {

// The shape every rule is broken from. seqlen_q != seqlen_k and nheads_q != nheads_kv
// so that a message naming the wrong size would be caught.
struct ArgsShape {
  std::int64_t batch = 2;
  std::int64_t seqlen_q = 64;
  std::int64_t seqlen_k = 96;
  std::int64_t nheads_q = 4;
  std::int64_t nheads_kv = 2;
  std::int64_t head_dim = 128;
  DType dtype = DType::kBFloat16;
  std::int64_t head_dim_v = 0;  // of v, out, dout and dv; 0: head_dim

  std::int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

// Host memory aligned to 256 bytes (beyond what any rule asks), so that an offset of a
// few bytes is what breaks an alignment rule, not the allocator.
class HostBuffer {
 public:
  static constexpr std::size_t kAlignment = 256;

  explicit HostBuffer(std::size_t bytes) : bytes_(bytes), storage_(new std::byte[bytes + kAlignment]) {
    auto addr = reinterpret_cast<std::uintptr_t>(storage_.get());
    data_ = storage_.get() + (kAlignment - addr % kAlignment) % kAlignment;
    std::memset(data_, 0, bytes_);
  }

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  // Every byte 0xff: a NaN in fp32, fp16 and bf16 alike, so a written element shows.
  void fill_nan_pattern() { std::memset(data_, 0xff, bytes_); }
  std::vector<std::byte> snapshot() const { return {data_, data_ + bytes_}; }
  bool equals(const std::vector<std::byte>& before) const {
    return before.size() == bytes_ && std::memcmp(before.data(), data_, bytes_) == 0;
  }

 private:
  std::size_t bytes_;
  std::unique_ptr<std::byte[]> storage_;
  std::byte* data_;
};

// Owns one buffer per tensor of either pass and hands out contiguous views of them.
class ValidArgs {
 public:
  explicit ValidArgs(const ArgsShape& s = {})
      : shape_(s),
        q_(bytes_qlike()), k_(bytes_kvlike()), v_(bytes_vlike()), out_(bytes_outlike()), lse_(bytes_lse()),
        dout_(bytes_outlike()), dq_(bytes_qlike()), dk_(bytes_kvlike()), dv_(bytes_vlike()),
        sinks_(bytes_heads()), dsinks_(bytes_heads()) {}

  const ArgsShape& shape() const { return shape_; }

  ForwardArgs forward() const {
    ForwardArgs a;
    a.q = qlike(q_);
    a.k = kvlike(k_);
    a.v = vlike(v_);
    a.out = outlike(out_);
    a.lse = lse(lse_);
    return a;
  }

  BackwardArgs backward() const {
    BackwardArgs a;
    a.q = qlike(q_);
    a.k = kvlike(k_);
    a.v = vlike(v_);
    a.out = outlike(out_);
    a.dout = outlike(dout_);
    a.lse = lse(lse_);
    a.dq = qlike(dq_);
    a.dk = kvlike(dk_);
    a.dv = vlike(dv_);
    return a;
  }

  // The same with attention sinks (and, for the backward, their gradient dsinks).
  ForwardArgs forward_with_sinks() const {
    ForwardArgs a = forward();
    a.sinks = heads(sinks_);
    return a;
  }

  BackwardArgs backward_with_sinks() const {
    BackwardArgs a = backward();
    a.sinks = heads(sinks_);
    a.dsinks = heads(dsinks_);
    return a;
  }

  HostBuffer& out() { return out_; }
  HostBuffer& lse() { return lse_; }
  HostBuffer& dq() { return dq_; }
  HostBuffer& dk() { return dk_; }
  HostBuffer& dv() { return dv_; }
  HostBuffer& dsinks() { return dsinks_; }

 private:
  std::size_t elem() const { return dtype_size(shape_.dtype); }
  std::size_t bytes_qlike() const {
    return static_cast<std::size_t>(shape_.batch * shape_.seqlen_q * shape_.nheads_q * shape_.head_dim) * elem();
  }
  std::size_t bytes_kvlike() const {
    return static_cast<std::size_t>(shape_.batch * shape_.seqlen_k * shape_.nheads_kv * shape_.head_dim) * elem();
  }
  std::size_t bytes_outlike() const {
    return static_cast<std::size_t>(shape_.batch * shape_.seqlen_q * shape_.nheads_q * shape_.value_dim()) * elem();
  }
  std::size_t bytes_vlike() const {
    return static_cast<std::size_t>(shape_.batch * shape_.seqlen_k * shape_.nheads_kv * shape_.value_dim()) * elem();
  }
  std::size_t bytes_lse() const {
    return static_cast<std::size_t>(shape_.batch * shape_.nheads_q * shape_.seqlen_q) * sizeof(float);
  }
  std::size_t bytes_heads() const { return static_cast<std::size_t>(shape_.nheads_q) * sizeof(float); }

  TensorView qlike(const HostBuffer& b) const {
    return TensorView::contiguous(b.data(), shape_.dtype,
                                  {shape_.batch, shape_.seqlen_q, shape_.nheads_q, shape_.head_dim});
  }
  TensorView kvlike(const HostBuffer& b) const {
    return TensorView::contiguous(b.data(), shape_.dtype,
                                  {shape_.batch, shape_.seqlen_k, shape_.nheads_kv, shape_.head_dim});
  }
  TensorView outlike(const HostBuffer& b) const {
    return TensorView::contiguous(b.data(), shape_.dtype,
                                  {shape_.batch, shape_.seqlen_q, shape_.nheads_q, shape_.value_dim()});
  }
  TensorView vlike(const HostBuffer& b) const {
    return TensorView::contiguous(b.data(), shape_.dtype,
                                  {shape_.batch, shape_.seqlen_k, shape_.nheads_kv, shape_.value_dim()});
  }
  TensorView lse(const HostBuffer& b) const {
    return TensorView::contiguous(b.data(), DType::kFloat32, {shape_.batch, shape_.nheads_q, shape_.seqlen_q});
  }
  TensorView heads(const HostBuffer& b) const {
    return TensorView::contiguous(b.data(), DType::kFloat32, {shape_.nheads_q});
  }

  ArgsShape shape_;
  HostBuffer q_, k_, v_, out_, lse_, dout_, dq_, dk_, dv_, sinks_, dsinks_;
};

// A GPU-like target that runs on any machine: the GPU's dtypes and head dims, no
// window, softcap, sinks or chunks, and a pointer check that accepts everything unless
// told which pointer to refuse and how to describe it.
inline ValidationTarget device_like_target(const void* refused = nullptr, std::string where = "host memory") {
  ValidationTarget t;
  t.space = ValidationTarget::Space::kDevice;
  t.dtypes = {DType::kBFloat16, DType::kFloat16};
  t.head_dims = {64, 96, 128, 192, 256};
  t.supports_window = false;
  t.supports_softcap = false;
  t.supports_sinks = false;
  t.locate = [refused, where](const void* ptr) { return ptr == refused ? where : std::string(); };
  return t;
}

// Moves a view's base pointer by `bytes` (alignment rules look at the address only).
inline void shift_pointer(TensorView& t, std::ptrdiff_t bytes) { t.data = static_cast<std::byte*>(t.data) + bytes; }

// Sets dim `d` of a view and keeps it row-major (strides recomputed).
inline void resize_dim(TensorView& t, int d, std::int64_t size) {
  t.shape[d] = size;
  std::int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.stride[i] = stride;
    stride *= t.shape[i] > 0 ? t.shape[i] : 1;
  }
}

}  // namespace fa3::test
