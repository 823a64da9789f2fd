"""Bandwidth of fa3's merge kernel: fa3.merge_attention_states_list and
fa3.flash_attn_combine on CUDA tensors, against the same merge in torch operations and
against a device-to-device copy of the same bytes (ANCHORS.md: 4.27 TB/s on the H200).

The merge reads every part's output and lse once and writes one output and lse, so it
is bound by memory: bytes = (parts + 1) * (rows * headdim * element + rows * 4), TB/s =
bytes / time. Points: 16384 tokens x 32 heads, head dims 64 / 128 / 256, bf16 and fp32,
2, 4 and 8 parts (ring attention merges 2 at a time); the combine over 2, 8 and 32 fp32
splits into bf16. Each point is first checked against the torch merge. Timing as in
bench_attention.py (median, L2 flushed). Writes <out-dir>/<YYYY-MM-DD>-<gpu>-merge.json
(records: impl, op, dtype, hdim, parts, tokens, nheads, ms, tbps, gpu).

    python bench/bench_merge.py
    python bench/bench_merge.py --tokens 4096 --hdims 128
"""

import argparse
import datetime
import json
import os
import sys

import torch

import fa3

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_attention import gpu_slug, median_ms  # noqa: E402


def torch_merge(outs, lses):
    """The merge in torch operations, fp32 (rows no part saw are not in these inputs)."""
    lse_parts = torch.stack([t.float() for t in lses])
    lse = torch.logsumexp(lse_parts, dim=0)
    weights = torch.exp(lse_parts - lse).permute(0, 1, 3, 2).unsqueeze(-1)
    out = sum(w * o.float() for w, o in zip(weights, outs))
    return out.to(outs[0].dtype), lse


def merge_points(args, gpu):
    records = []
    for dtype in (torch.bfloat16, torch.float32):
        for hdim in args.hdims:
            for parts in (2, 4, 8):
                outs = [torch.randn(1, args.tokens, args.nheads, hdim, device="cuda", dtype=dtype) for _ in range(parts)]
                lses = [torch.randn(1, args.nheads, args.tokens, device="cuda") * 3 for _ in range(parts)]
                out, lse = fa3.merge_attention_states_list(outs, lses)
                want_out, want_lse = torch_merge(outs, lses)
                tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
                torch.testing.assert_close(out.float(), want_out.float(), atol=tol, rtol=0)
                torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=0)
                rows = args.tokens * args.nheads
                nbytes = (parts + 1) * (rows * hdim * outs[0].element_size() + rows * 4)
                flat = torch.empty(nbytes // 2, dtype=torch.int8, device="cuda")
                copy_to = torch.empty_like(flat)
                for impl, fn in (
                    ("fa3", lambda: fa3.merge_attention_states_list(outs, lses)),
                    ("torch", lambda: torch_merge(outs, lses)),
                    ("copy", lambda: copy_to.copy_(flat)),
                ):
                    ms = median_ms(fn, args.rep_ms)
                    records.append(
                        {"impl": impl, "op": "merge", "dtype": str(dtype).removeprefix("torch."), "hdim": hdim,
                         "parts": parts, "tokens": args.tokens, "nheads": args.nheads, "ms": ms,
                         "tbps": nbytes / ms / 1e9, "gpu": gpu}
                    )
                    print(f"merge {records[-1]['dtype']} hdim {hdim} parts {parts} {impl}: {ms:.4f} ms "
                          f"{records[-1]['tbps']:.2f} TB/s", flush=True)
    return records


def combine_points(args, gpu):
    records = []
    for hdim in args.hdims:
        for splits in (2, 8, 32):
            out_partial = torch.randn(splits, args.tokens, args.nheads, hdim, device="cuda")
            lse_partial = torch.randn(splits, args.tokens, args.nheads, device="cuda") * 3
            out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=torch.bfloat16)
            want_out, want_lse = torch_merge(list(out_partial.unsqueeze(1)), list(lse_partial.transpose(1, 2).unsqueeze(1)))
            torch.testing.assert_close(out.float(), want_out[0].to(torch.bfloat16).float(), atol=2e-2, rtol=0)
            torch.testing.assert_close(lse, want_lse[0].transpose(0, 1), atol=1e-5, rtol=0)
            rows = args.tokens * args.nheads
            nbytes = splits * rows * (hdim * 4 + 4) + rows * (hdim * 2 + 4)
            ms = median_ms(lambda: fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=torch.bfloat16), args.rep_ms)
            records.append(
                {"impl": "fa3", "op": "combine", "dtype": "bfloat16", "hdim": hdim, "parts": splits,
                 "tokens": args.tokens, "nheads": args.nheads, "ms": ms, "tbps": nbytes / ms / 1e9, "gpu": gpu}
            )
            print(f"combine hdim {hdim} splits {splits}: {ms:.4f} ms {records[-1]['tbps']:.2f} TB/s", flush=True)
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--nheads", type=int, default=32)
    parser.add_argument("--hdims", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 256])
    parser.add_argument("--rep-ms", type=int, default=200)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_merge.py needs a CUDA device")
    gpu = torch.cuda.get_device_name()
    records = merge_points(args, gpu) + combine_points(args, gpu)
    name = f"{datetime.date.today().isoformat()}-{gpu_slug(gpu)}-merge.json"
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, name), "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {os.path.join(args.out_dir, name)}")


if __name__ == "__main__":
    main()
