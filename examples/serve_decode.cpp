// Serving from C++: decode steps over a paged KV cache with fa3::forward_with_kvcache.
// Each step appends one new token's k and v per sequence to its cache, in place, and
// attends that token's query to everything cached so far. The caller owns every buffer
// (the cache pages, the page table, the lengths, the workspace) and the stream. On a
// Hopper GPU with the GPU KV-cache path built in (fa3::build_info().gpu_kvcache) the
// calls run there on device memory; otherwise the CPU path takes the same arguments
// on host memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fa3/fa3.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

int main() {
  const int batch = 4, heads = 8, heads_kv = 2, head_dim = 128;  // GQA: 4 query heads per KV head
  const int page_size = 64, pages_per_seq = 8, num_pages = batch * pages_per_seq, steps = 16;
  std::vector<int> seqlens = {37, 100, 5, 250};  // tokens each sequence's cache holds (its prompt)
  const bool gpu = fa3::current_device().is_hopper() && fa3::build_info().gpu_kvcache;

  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  auto random_bf16 = [&](size_t n) {
    std::vector<__nv_bfloat16> x(n);
    for (auto& e : x) e = __float2bfloat16(normal(rng));
    return x;
  };
  // The cache as a pool of pages; each sequence's pages in any order, by its page table.
  const size_t cache_elems = size_t(num_pages) * page_size * heads_kv * head_dim;
  std::vector<__nv_bfloat16> k_cache = random_bf16(cache_elems), v_cache = random_bf16(cache_elems);
  std::vector<int> page_table(size_t(batch) * pages_per_seq);
  std::iota(page_table.begin(), page_table.end(), 0);
  std::shuffle(page_table.begin(), page_table.end(), rng);
  const size_t q_elems = size_t(batch) * heads * head_dim, new_elems = size_t(batch) * heads_kv * head_dim;
  std::vector<__nv_bfloat16> q, k_new, v_new, out(q_elems);

  // Where the buffers live: device copies on the GPU, the host vectors themselves on the CPU.
  auto place = [&](void* host, size_t bytes) -> void* {
    if (!gpu) return host;
    void* device = nullptr;
    cudaMalloc(&device, bytes);
    cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice);
    return device;
  };
  using fa3::DType;
  using fa3::TensorView;
  const size_t bf16 = sizeof(__nv_bfloat16);
  fa3::KvCacheArgs args;
  args.k_cache = TensorView::contiguous(place(k_cache.data(), cache_elems * bf16), DType::kBFloat16,
                                        {num_pages, page_size, heads_kv, head_dim});
  args.v_cache = TensorView::contiguous(place(v_cache.data(), cache_elems * bf16), DType::kBFloat16,
                                        {num_pages, page_size, heads_kv, head_dim});
  args.page_table = TensorView::contiguous(place(page_table.data(), page_table.size() * sizeof(int)),
                                           DType::kInt32, {batch, pages_per_seq});
  args.cache_seqlens = TensorView::contiguous(place(seqlens.data(), batch * sizeof(int)), DType::kInt32, {batch});
  std::vector<__nv_bfloat16> staging(q_elems);  // the device buffers' first contents
  args.q = TensorView::contiguous(place(staging.data(), q_elems * bf16), DType::kBFloat16, {batch, 1, heads, head_dim});
  args.k_new = TensorView::contiguous(place(staging.data(), new_elems * bf16), DType::kBFloat16,
                                      {batch, 1, heads_kv, head_dim});
  args.v_new = TensorView::contiguous(place(staging.data(), new_elems * bf16), DType::kBFloat16,
                                      {batch, 1, heads_kv, head_dim});
  args.out = TensorView::contiguous(place(out.data(), q_elems * bf16), DType::kBFloat16, {batch, 1, heads, head_dim});
  args.options.causal = true;  // the new token sees the whole cache, itself included

  // Every step has the same shapes, so one workspace, sized once, serves them all.
  cudaStream_t stream = nullptr;
  if (gpu) {
    cudaStreamCreate(&stream);
    fa3::Status sized = fa3::kvcache_workspace_size(args, &args.workspace_bytes);
    if (!sized.is_ok()) {
      std::fprintf(stderr, "fa3: %s\n", sized.to_string().c_str());
      return 1;
    }
    if (args.workspace_bytes > 0) cudaMalloc(&args.workspace, args.workspace_bytes);
  }

  for (int step = 0; step < steps; ++step) {
    // The new token's projections (a model would compute them).
    q = random_bf16(q_elems);
    k_new = random_bf16(new_elems);
    v_new = random_bf16(new_elems);
    fa3::Status status;
    if (gpu) {
      // From pageable host memory these copies return once the data is staged, so the
      // host vectors may change right after.
      cudaMemcpyAsync(args.q.data, q.data(), q_elems * bf16, cudaMemcpyHostToDevice, stream);
      cudaMemcpyAsync(args.k_new.data, k_new.data(), new_elems * bf16, cudaMemcpyHostToDevice, stream);
      cudaMemcpyAsync(args.v_new.data, v_new.data(), new_elems * bf16, cudaMemcpyHostToDevice, stream);
      cudaMemcpyAsync(args.cache_seqlens.data, seqlens.data(), batch * sizeof(int), cudaMemcpyHostToDevice, stream);
      status = fa3::forward_with_kvcache(args, stream);  // asynchronous on `stream`
    } else {
      args.q.data = q.data();
      args.k_new.data = k_new.data();
      args.v_new.data = v_new.data();
      status = fa3::cpu::forward_with_kvcache(args);
    }
    if (!status.is_ok()) {
      std::fprintf(stderr, "fa3: %s\n", status.to_string().c_str());
      return 1;
    }
    for (int& n : seqlens) ++n;  // the appended token now belongs to each cache
  }

  if (gpu) {
    cudaMemcpyAsync(out.data(), args.out.data, q_elems * bf16, cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    for (void* p : {args.k_cache.data, args.v_cache.data, args.page_table.data, args.cache_seqlens.data, args.q.data,
                    args.k_new.data, args.v_new.data, args.out.data, args.workspace}) {
      cudaFree(p);
    }
  }
  std::printf("out[0] = %f after %d decode steps (%s)\n", __bfloat162float(out[0]), steps, gpu ? "gpu" : "cpu");
  return 0;
}
