"""Serving from Python: prompts of different lengths prefilled into a paged KV cache,
then decode steps that append each new token's k and v in place and attend over the
whole cache, all through fa3.flash_attn_with_kvcache (FlashAttention-3's signature).

Runs on a Hopper GPU when fa3 was built with its GPU KV-cache path
(fa3.build_info()["gpu_kvcache"]), else on the CPU path with the same calls.

    python examples/serve_decode.py [--steps 16] [--device cpu|cuda]
"""

import argparse

import torch

import fa3


def default_device():
    usable = torch.cuda.is_available() and fa3.build_info()["gpu_kvcache"]
    return "cuda" if usable and torch.cuda.get_device_capability() == (9, 0) else "cpu"


def serve(prompt_lens=(37, 100, 5, 250), steps=16, device=None, seed=0):
    """Returns the last step's query and output (batch, 1, heads, head_dim) and the cache
    after it: (k_cache, v_cache, page_table, cache_seqlens)."""
    device = device or default_device()
    batch, heads, heads_kv, head_dim = len(prompt_lens), 8, 2, 128  # GQA: 4 query heads per KV head
    page_size, pages_per_seq = 64, 8
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    # A pool of pages; each sequence owns pages_per_seq of them, in any order.
    num_pages = batch * pages_per_seq
    k_cache = torch.zeros(num_pages, page_size, heads_kv, head_dim, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    page_table = torch.randperm(num_pages, generator=g).view(batch, pages_per_seq).to(device, torch.int32)
    cache_seqlens = torch.zeros(batch, device=device, dtype=torch.int32)

    # Prefill, one prompt at a time (their lengths differ): the call writes the prompt's
    # k and v into the sequence's pages and runs causal attention over them.
    for b, length in enumerate(prompt_lens):
        q = randn(1, length, heads, head_dim)
        k, v = randn(1, length, heads_kv, head_dim), randn(1, length, heads_kv, head_dim)
        fa3.flash_attn_with_kvcache(
            q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens[b : b + 1],
            page_table=page_table[b : b + 1], causal=True,
        )
    cache_seqlens += torch.tensor(prompt_lens, device=device, dtype=torch.int32)

    # Decode: one token per sequence and step, the whole batch in one call.
    for _ in range(steps):
        q = randn(batch, 1, heads, head_dim)
        k, v = randn(batch, 1, heads_kv, head_dim), randn(batch, 1, heads_kv, head_dim)
        out = fa3.flash_attn_with_kvcache(
            q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens, page_table=page_table, causal=True
        )
        cache_seqlens += 1  # the appended token now belongs to each cache
    return q, out, (k_cache, v_cache, page_table, cache_seqlens)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    args = parser.parse_args(argv)
    _, out, _ = serve(steps=args.steps, device=args.device)
    print(f"out[0] = {out.flatten()[0].item():f} after {args.steps} decode steps ({out.device.type})")


if __name__ == "__main__":
    main()
