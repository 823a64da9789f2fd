// Attention forward from C++ with raw pointers: on a Hopper GPU through fa3::forward
// (device memory, a CUDA stream), otherwise through the CPU path fa3::cpu::forward.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fa3/fa3.h>

#include <cstdio>
#include <random>
#include <vector>

int main() {
  const int batch = 2, seqlen = 512, heads = 8, head_dim = 128;
  const size_t n = size_t(batch) * seqlen * heads * head_dim;

  // Inputs in (batch, seqlen, heads, head_dim) layout, bf16.
  std::vector<__nv_bfloat16> q(n), k(n), v(n), out(n);
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < n; ++i) {
    q[i] = __float2bfloat16(normal(rng));
    k[i] = __float2bfloat16(normal(rng));
    v[i] = __float2bfloat16(normal(rng));
  }
  std::vector<float> lse(size_t(batch) * heads * seqlen);

  auto view = [&](void* data) {
    return fa3::TensorView::contiguous(data, fa3::DType::kBFloat16, {batch, seqlen, heads, head_dim});
  };
  fa3::ForwardArgs args;
  args.options.causal = true;  // softmax_scale defaults to 1/sqrt(head_dim)

  fa3::Status status;
  if (fa3::current_device().is_hopper()) {
    void *dq, *dk, *dv, *dout;
    float* dlse;
    const size_t bytes = n * sizeof(__nv_bfloat16);
    cudaMalloc(&dq, bytes);
    cudaMalloc(&dk, bytes);
    cudaMalloc(&dv, bytes);
    cudaMalloc(&dout, bytes);
    cudaMalloc(&dlse, lse.size() * sizeof(float));
    cudaMemcpy(dq, q.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dk, k.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, v.data(), bytes, cudaMemcpyHostToDevice);
    args.q = view(dq);
    args.k = view(dk);
    args.v = view(dv);
    args.out = view(dout);
    args.lse = fa3::TensorView::contiguous(dlse, fa3::DType::kFloat32, {batch, heads, seqlen});

    cudaStream_t stream;
    cudaStreamCreate(&stream);
    status = fa3::forward(args, stream);  // asynchronous on `stream`
    cudaMemcpyAsync(out.data(), dout, bytes, cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    for (void* p : {dq, dk, dv, dout, static_cast<void*>(dlse)}) cudaFree(p);
  } else {
    args.q = view(q.data());
    args.k = view(k.data());
    args.v = view(v.data());
    args.out = view(out.data());
    args.lse = fa3::TensorView::contiguous(lse.data(), fa3::DType::kFloat32, {batch, heads, seqlen});
    status = fa3::cpu::forward(args);
  }

  if (!status.is_ok()) {
    std::fprintf(stderr, "fa3: %s\n", status.to_string().c_str());
    return 1;
  }
  std::printf("out[0] = %f (fa3 %s)\n", __bfloat162float(out[0]), fa3::build_info().version.c_str());
  return 0;
}
