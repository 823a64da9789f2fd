// Valid varlen forward/backward arguments over real host buffers, for tests that break
// one rule of a variable-length call at a time (see valid_args.h for the fixed-length
// ones).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "fa3/attention.h"
#include "valid_args.h"

namespace fa3::test {

// Three sequences: query lengths 5, 0, 7 (cu_seqlens_q 0, 5, 5, 12) in 14 rows, so that
// two rows lie past the last sequence; key lengths 9, 3, 0 (cu_seqlens_k 0, 9, 12, 12)
// in 13 rows; seqused_q 4, 0, 7 and seqused_k 9, 2, 0; max_seqlen_q 7, max_seqlen_k 9.
// 4 query heads on 2 KV heads, head dim 128, bf16. Every size differs from the others,
// so that a message naming the wrong one would be caught.
class ValidVarlenArgs {
 public:
  static constexpr std::int64_t kBatch = 3;
  static constexpr std::int64_t kTotalQ = 14;
  static constexpr std::int64_t kTotalK = 13;
  static constexpr std::int64_t kHeadsQ = 4;
  static constexpr std::int64_t kHeadsKv = 2;
  static constexpr std::int64_t kHeadDim = 128;

  ValidVarlenArgs()
      : q_(rows_bytes(kTotalQ, kHeadsQ)),
        k_(rows_bytes(kTotalK, kHeadsKv)),
        v_(rows_bytes(kTotalK, kHeadsKv)),
        out_(rows_bytes(kTotalQ, kHeadsQ)),
        dout_(rows_bytes(kTotalQ, kHeadsQ)),
        lse_(kHeadsQ * kTotalQ * sizeof(float)),
        dq_(rows_bytes(kTotalQ, kHeadsQ)),
        dk_(rows_bytes(kTotalK, kHeadsKv)),
        dv_(rows_bytes(kTotalK, kHeadsKv)),
        cu_q_(index_bytes(kBatch + 1)),
        cu_k_(index_bytes(kBatch + 1)),
        used_q_(index_bytes(kBatch)),
        used_k_(index_bytes(kBatch)) {
    write(cu_q_, {0, 5, 5, 12});
    write(cu_k_, {0, 9, 12, 12});
    write(used_q_, {4, 0, 7});
    write(used_k_, {9, 2, 0});
  }

  VarlenArgs varlen() const {
    VarlenArgs v;
    v.cu_seqlens_q = index(cu_q_, kBatch + 1);
    v.cu_seqlens_k = index(cu_k_, kBatch + 1);
    v.seqused_q = index(used_q_, kBatch);
    v.seqused_k = index(used_k_, kBatch);
    v.max_seqlen_q = 7;
    v.max_seqlen_k = 9;
    return v;
  }

  ForwardArgs forward() const {
    ForwardArgs a;
    a.q = rows(q_, kTotalQ, kHeadsQ);
    a.k = rows(k_, kTotalK, kHeadsKv);
    a.v = rows(v_, kTotalK, kHeadsKv);
    a.out = rows(out_, kTotalQ, kHeadsQ);
    a.lse = lse(lse_);
    a.varlen = varlen();
    return a;
  }

  BackwardArgs backward() const {
    BackwardArgs a;
    a.q = rows(q_, kTotalQ, kHeadsQ);
    a.k = rows(k_, kTotalK, kHeadsKv);
    a.v = rows(v_, kTotalK, kHeadsKv);
    a.out = rows(out_, kTotalQ, kHeadsQ);
    a.dout = rows(dout_, kTotalQ, kHeadsQ);
    a.lse = lse(lse_);
    a.dq = rows(dq_, kTotalQ, kHeadsQ);
    a.dk = rows(dk_, kTotalK, kHeadsKv);
    a.dv = rows(dv_, kTotalK, kHeadsKv);
    a.varlen = varlen();
    return a;
  }

  HostBuffer& out() { return out_; }
  HostBuffer& lse() { return lse_; }
  HostBuffer& dq() { return dq_; }
  HostBuffer& dk() { return dk_; }
  HostBuffer& dv() { return dv_; }

 private:
  static std::size_t rows_bytes(std::int64_t total, std::int64_t heads) {
    return static_cast<std::size_t>(total * heads * kHeadDim) * dtype_size(DType::kBFloat16);
  }
  static std::size_t index_bytes(std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(std::int32_t); }
  static void write(HostBuffer& b, const std::vector<std::int32_t>& values) {
    std::memcpy(b.data(), values.data(), values.size() * sizeof(std::int32_t));
  }
  static TensorView rows(const HostBuffer& b, std::int64_t total, std::int64_t heads) {
    return TensorView::contiguous(b.data(), DType::kBFloat16, {total, heads, kHeadDim});
  }
  static TensorView lse(const HostBuffer& b) {
    return TensorView::contiguous(b.data(), DType::kFloat32, {kHeadsQ, kTotalQ});
  }
  static TensorView index(const HostBuffer& b, std::int64_t n) {
    return TensorView::contiguous(b.data(), DType::kInt32, {n});
  }

  HostBuffer q_, k_, v_, out_, dout_, lse_, dq_, dk_, dv_, cu_q_, cu_k_, used_q_, used_k_;
};

}  // namespace fa3::test
