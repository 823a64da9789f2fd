// fa3 program — host buffers for q, k, v, out, lse and the sinks, and for the backward's
// dout, dq, dk and dv, with random normal inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "fa3/tensor.h"
#include "shape.h"

namespace fa3::cli {

// Fills `count` elements of `dtype` with N(0, 1) draws rounded to the dtype.
// Deterministic in (seed, stream), whatever the number of threads used.
void fill_normal(void* data, DType dtype, std::int64_t count, std::uint64_t seed, std::uint64_t stream);

// Every byte 0xff: a NaN in fp32, fp16 and bf16, so an element the call never wrote
// shows up as a NaN in the check.
void fill_nan(void* data, std::size_t bytes);

class HostTensors {
 public:
  // q, k, v random normal (independent streams of `seed`); out and lse NaN; `sinks` as
  // given (empty: none).
  HostTensors(const TensorCapacity& capacity, DType dtype, std::uint64_t seed, const std::vector<float>& sinks = {});

  TensorPointers pointers() const {
    return {q_.get(),
            k_.get(),
            v_.get(),
            out_.get(),
            reinterpret_cast<float*>(lse_.get()),
            sinks_bytes_ > 0 ? reinterpret_cast<float*>(sinks_.get()) : nullptr};
  }
  std::size_t q_bytes() const { return q_bytes_; }
  std::size_t kv_bytes() const { return kv_bytes_; }  // of k
  std::size_t v_bytes() const { return v_bytes_; }
  std::size_t out_bytes() const { return out_bytes_; }
  std::size_t lse_bytes() const { return lse_bytes_; }
  std::size_t sinks_bytes() const { return sinks_bytes_; }  // 0: no sinks

 private:
  std::size_t q_bytes_, kv_bytes_, v_bytes_, out_bytes_, lse_bytes_, sinks_bytes_;
  // Left uninitialised by allocation: every byte is filled right after.
  std::unique_ptr<std::byte[]> q_, k_, v_, out_, lse_, sinks_;
};

class HostGradients {
 public:
  // dout random normal (a stream of `seed` that q, k and v do not use); dq, dk, dv NaN.
  HostGradients(const TensorCapacity& capacity, DType dtype, std::uint64_t seed);

  GradientPointers pointers() const { return {dout_.get(), dq_.get(), dk_.get(), dv_.get()}; }
  std::size_t q_bytes() const { return q_bytes_; }      // of dq
  std::size_t kv_bytes() const { return kv_bytes_; }    // of dk
  std::size_t v_bytes() const { return v_bytes_; }      // of dv
  std::size_t out_bytes() const { return out_bytes_; }  // of dout

  // dq, dk and dv byte for byte: what a deterministic backward must reproduce.
  std::vector<std::byte> gradient_bytes() const;

 private:
  std::size_t q_bytes_, kv_bytes_, v_bytes_, out_bytes_;
  std::unique_ptr<std::byte[]> dout_, dq_, dk_, dv_;
};

}  // namespace fa3::cli
