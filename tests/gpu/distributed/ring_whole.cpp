#include "distributed/ring_whole.h"

#include <cuda_runtime_api.h>

#include "distributed/ring_shards.h"

namespace fa3::test {
namespace {

template <class T>
std::vector<T> download(const DeviceBuffer& buf) {
  std::vector<T> host(buf.bytes() / sizeof(T));
  EXPECT_EQ(cudaMemcpy(host.data(), buf.get(), buf.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

}  // namespace

TensorView bf16_rows(void* data, std::int64_t batch, std::int64_t len, std::int64_t heads, std::int64_t dim) {
  return TensorView::contiguous(data, DType::kBFloat16, {batch, len, heads, dim});
}

void make_whole(const RingCase& c, Whole* w) {
  const std::int64_t nq = c.batch * c.seqlen * c.nheads * c.head_dim;
  const std::int64_t nkv = c.batch * c.seqlen * c.nheads_kv * c.head_dim;
  w->q = random_bf16(nq, 11);
  w->k = random_bf16(nkv, 12);
  w->v = random_bf16(nkv, 13);
  w->dout = random_bf16(nq, 14);
  DeviceBuffer* b = w->buffers;
  b[0] = upload(w->q);
  b[1] = upload(w->k);
  b[2] = upload(w->v);
  b[3] = DeviceBuffer(nq * 2);
  b[4] = upload(w->dout);
  b[5] = DeviceBuffer(c.batch * c.nheads * c.seqlen * 4);
  b[6] = DeviceBuffer(nq * 2);
  b[7] = DeviceBuffer(nkv * 2);
  b[8] = DeviceBuffer(nkv * 2);
  BackwardArgs& a = w->args;
  a.q = bf16_rows(b[0].get(), c.batch, c.seqlen, c.nheads, c.head_dim);
  a.k = bf16_rows(b[1].get(), c.batch, c.seqlen, c.nheads_kv, c.head_dim);
  a.v = bf16_rows(b[2].get(), c.batch, c.seqlen, c.nheads_kv, c.head_dim);
  a.out = bf16_rows(b[3].get(), c.batch, c.seqlen, c.nheads, c.head_dim);
  a.dout = bf16_rows(b[4].get(), c.batch, c.seqlen, c.nheads, c.head_dim);
  a.lse = TensorView::contiguous(b[5].get(), DType::kFloat32, {c.batch, c.nheads, c.seqlen});
  a.dq = bf16_rows(b[6].get(), c.batch, c.seqlen, c.nheads, c.head_dim);
  a.dk = bf16_rows(b[7].get(), c.batch, c.seqlen, c.nheads_kv, c.head_dim);
  a.dv = bf16_rows(b[8].get(), c.batch, c.seqlen, c.nheads_kv, c.head_dim);
  a.options.causal = c.causal;
  a.deterministic = c.deterministic;
  ForwardArgs f;
  f.q = a.q;
  f.k = a.k;
  f.v = a.v;
  f.out = a.out;
  f.lse = a.lse;
  f.options.causal = c.causal;
  // The build may lack the case's kernels (FA3_HEAD_DIMS): the calls say so.
  std::size_t bytes = 0;
  Status st = backward_workspace_size(a, &bytes);
  if (st.code() == StatusCode::kNotSupported) GTEST_SKIP() << st.to_string();
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  st = forward(f, nullptr);
  if (st.code() == StatusCode::kNotSupported) GTEST_SKIP() << st.to_string();
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  w->out = download<__nv_bfloat16>(b[3]);
  w->lse = download<float>(b[5]);
  w->ref = backward_reference(a);
}

BackwardReport compare_gradients(Whole& w, const Gradients& grads) {
  const std::array<const TensorView*, kGradients> views = gradient_views(w.args);
  for (int g = 0; g < kGradients; ++g) {
    std::vector<__nv_bfloat16> values(grads[g].size());
    for (std::size_t e = 0; e < values.size(); ++e) values[e] = __float2bfloat16(grads[g][e]);
    EXPECT_EQ(cudaMemcpy(views[g]->data, values.data(), values.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  return compare_backward(w.args, w.ref);
}

BackwardReport one_gpu_backward(Whole& w) {
  std::size_t bytes = 0;
  Status st = backward_workspace_size(w.args, &bytes);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  DeviceBuffer workspace(bytes);
  BackwardArgs a = w.args;
  a.workspace = workspace.get();
  a.workspace_bytes = bytes;
  st = backward(a, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return compare_backward(w.args, w.ref);
}

}  // namespace fa3::test
