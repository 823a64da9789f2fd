"""Train a small GPT twice, attention through fa3 and through cuDNN, and compare.

A check that fa3's forward and backward train a model as well as PyTorch's own
attention does, and an example of putting fa3 into a model: attention is one call,
fa3.flash_attn_func(q, k, v, causal=True), on (batch, seqlen, heads, head_dim)
tensors, where SDPA wants (batch, heads, seqlen, head_dim).

The model is Llama-shaped: 8 blocks of width 1024, RMSNorm before attention and
before a SwiGLU MLP, rotary positions, no biases; attention has 16 heads of 128
(2048 wide, projected from and back to the 1024-wide residual stream). Weights and
optimizer state are fp32 (AdamW), matmuls and attention run in bf16 under autocast.

The task is synthetic and the same for both runs: each sequence is a walk of 1025
tokens on a fixed random Markov chain (512 tokens, 32 successors each), followed by
its first 1024 tokens again. The first half can be learnt only as far as the chain's
entropy allows; the second half is a copy that attention can learn exactly, so the
loss falls from ln(512) = 6.2 to about half the chain's entropy (printed as the
floor). Both runs start from the same seed, see the same batches, and differ only in
the attention kernels; the final loss (mean of the last 10 steps) must agree within
--tolerance (1 %). The copy is learnt suddenly, around step 200 at the defaults;
the 400 steps leave the runs time to settle after it. Tokens/s leave out the first
10 steps.

    python examples/train_gpt.py                # 400 steps of 16 x 2048 tokens per run, about 2 minutes on an H200
    python examples/train_gpt.py --quick        # 60 steps of 4 x 2048: a smoke test, no check
    python examples/train_gpt.py --steps 500 --batch 32 --seed 1 --out-dir /tmp/results

Writes <out-dir>/<YYYY-MM-DD>-<gpu>-train[-quick].json (configuration, per-step
losses, tokens/s, peak memory, GPU, date) and a PNG of the loss curves beside it;
the default out-dir is bench/results/. Exit status 1 when a run fails or the final
losses differ by more than the tolerance. --device cpu runs fa3's CPU path and
PyTorch's default SDPA (--impls fa3 sdpa): slow, meant for small sizes
(--layers 2 --width 64 --heads 2 --head-dim 32 --seq-len 128).
"""

import argparse
import datetime
import json
import math
import re
import sys
import time
from pathlib import Path

import fa3  # imports torch before its extension, so that both share torch's CUDA runtime
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

# ---- attention: (batch, seqlen, heads, head_dim) in and out, causal ----


def fa3_attention(q, k, v):
    return fa3.flash_attn_func(q, k, v, causal=True)


def sdpa_attention(backend):
    def attend(q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if backend is None:  # PyTorch chooses
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2)

    return attend


ATTENTION = {
    "fa3": fa3_attention,
    "cudnn": sdpa_attention(SDPBackend.CUDNN_ATTENTION),
    "sdpa": sdpa_attention(None),
}
LABELS = {"fa3": "fa3", "cudnn": "cuDNN (SDPA)", "sdpa": "SDPA (PyTorch's choice)"}


# ---- the model ----


def rotary_tables(seq_len, head_dim, device, base=10000.0):
    """cos and sin of the rotation angles, (seq_len, 1, head_dim / 2), fp32."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def apply_rotary(x, cos, sin):
    """Rotates pairs (x[..., i], x[..., i + head_dim / 2]) of x: (batch, seqlen, heads,
    head_dim); in fp32, returned in x's dtype."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, width, heads, head_dim, attend):
        super().__init__()
        self.heads, self.head_dim, self.attend = heads, head_dim, attend
        self.qkv = nn.Linear(width, 3 * heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, width, bias=False)

    def forward(self, x, cos, sin):
        batch, seqlen, _ = x.shape
        # Views of one projection, last dimension contiguous: what fa3 reads without copies.
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, self.head_dim).unbind(dim=2)
        out = self.attend(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v)
        return self.out(out.reshape(batch, seqlen, self.heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.out = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.out(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, width, heads, head_dim, mlp_hidden, attend):
        super().__init__()
        self.attn_norm = nn.RMSNorm(width)
        self.attn = Attention(width, heads, head_dim, attend)
        self.mlp_norm = nn.RMSNorm(width)
        self.mlp = SwiGLU(width, mlp_hidden)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, vocab, layers, width, heads, head_dim, attend):
        super().__init__()
        # SwiGLU's hidden size: 8/3 of the width (the MLP's cost of a 4x GELU MLP), rounded up to 256.
        mlp_hidden = math.ceil(8 * width / 3 / 256) * 256
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, head_dim, mlp_hidden, attend) for _ in range(layers))
        self.norm = nn.RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head_dim = head_dim
        # GPT-2's initialisation: N(0, 0.02), the projections into the residual stream
        # scaled by 1/sqrt(2 * layers) so that its variance does not grow with depth.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(".out.weight") else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, tokens):
        cos, sin = rotary_tables(tokens.shape[1], self.head_dim, tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


# ---- the task ----


class MarkovCopyTask:
    """A fixed random Markov chain; sequences are a walk on it followed by a repeat of
    the walk. Everything is drawn on the CPU from one seed, so the data do not depend
    on the device."""

    def __init__(self, vocab, successors, seed):
        gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.next_tokens = torch.stack([torch.randperm(vocab, generator=gen)[:successors] for _ in range(vocab)])
        # Dirichlet(1) weights: some successors likely, some rare, as in real text.
        weights = -torch.rand(vocab, successors, generator=gen, dtype=torch.float64).log()
        self.probs = weights / weights.sum(dim=1, keepdim=True)
        self.cumulative = self.probs.cumsum(dim=1)
        self.cumulative[:, -1] = 1.0  # no draw can fall past the last successor
        self.entropy = -(self.probs * self.probs.log()).sum(dim=1)  # nats, per current token
        self.gen = gen

    def sequences(self, count, seq_len):
        """(count, seq_len + 1) int64: a walk of seq_len / 2 + 1 tokens, then its first
        seq_len / 2 tokens again; inputs are [:, :-1], targets [:, 1:]."""
        half = seq_len // 2
        walk = torch.empty(count, half + 1, dtype=torch.int64)
        walk[:, 0] = torch.randint(self.vocab, (count,), generator=self.gen)
        draws = torch.rand(half, count, 1, generator=self.gen, dtype=torch.float64)
        for t in range(half):
            current = walk[:, t]
            choice = torch.searchsorted(self.cumulative[current], draws[t]).squeeze(1)
            walk[:, t + 1] = self.next_tokens[current, choice]
        return torch.cat((walk, walk[:, : seq_len - half]), dim=1)

    def loss_floor(self, sequences):
        """The expected loss of a model that knows the chain and copies perfectly: the
        chain's entropy on the walk's targets, zero on the copy's."""
        half = (sequences.shape[1] - 1) // 2
        return (self.entropy[sequences[:, :half]].sum(dim=1) / (sequences.shape[1] - 1)).mean().item()


# ---- training ----


def learning_rate(step, args):
    """Linear warm-up, then cosine decay to a tenth of the peak at the last step."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - 1 - args.warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(impl, data, args, device):
    """Trains from args.seed on data (steps, batch, seq_len + 1); returns the run's record."""
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.layers, args.width, args.heads, args.head_dim, ATTENTION[impl]).to(device)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )
    half = args.seq_len // 2
    # Kept on the device and read once at the end, so that logging does not stall the GPU.
    losses = torch.zeros(args.steps, 2, device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timed_from = min(10, args.steps - 1)
    start = time.perf_counter()
    for step in range(args.steps):
        if step == timed_from:
            synchronize(device)
            timed_start = time.perf_counter()
        batch = data[step].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        token_losses = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
        token_losses = token_losses.view(batch.shape[0], -1)
        loss = token_losses.mean()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses[step, 0] = loss.detach()
        losses[step, 1] = token_losses[:, half:].detach().mean()
        if step % args.log_every == 0 or step == args.steps - 1:
            total, copy = losses[step].tolist()
            print(
                f"  {impl:5s} step {step:4d}/{args.steps}  loss {total:.4f}  (copy half {copy:.4f})  "
                f"{time.perf_counter() - start:6.1f} s",
                flush=True,
            )
    synchronize(device)
    elapsed = time.perf_counter() - timed_start
    losses = losses.cpu()
    tokens = (args.steps - timed_from) * data.shape[1] * args.seq_len
    record = {
        "losses": losses[:, 0].tolist(),
        "copy_losses": losses[:, 1].tolist(),
        "final_loss": losses[-10:, 0].mean().item(),
        "tokens_per_s": tokens / elapsed,
        "seconds": time.perf_counter() - start,
    }
    if device.type == "cuda":
        record["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    return record


# ---- output ----


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    colours = {"fa3": "#c0392b", "cudnn": "#2e86c1", "sdpa": "#27ae60"}
    runs = {impl: run for impl, run in result["runs"].items() if "losses" in run}
    fig, (curves, diff) = plt.subplots(1, 2, figsize=(13, 4.5))
    for impl, run in runs.items():
        label = f"{LABELS[impl]}: {run['tokens_per_s'] / 1e3:.0f}k tokens/s, final {run['final_loss']:.4f}"
        curves.plot(run["losses"], color=colours[impl], label=label)
        curves.plot(run["copy_losses"], color=colours[impl], linestyle="--", linewidth=0.8)
    curves.axhline(result["loss_floor"], color="grey", linestyle=":", label=f"floor {result['loss_floor']:.3f}")
    curves.set_xlabel("step")
    curves.set_ylabel("loss (nats; dashed: copy half)")
    curves.legend(fontsize=8)
    curves.grid(alpha=0.3)
    names = list(runs)
    if len(names) == 2:
        a, b = (torch.tensor(runs[n]["losses"]) for n in names)
        relative = 100 * (a - b) / b
        window = min(10, len(relative))
        smooth = relative.unfold(0, window, 1).mean(dim=1)
        diff.plot(range(window - 1, len(relative)), smooth, color="black")
        tolerance = 100 * result["tolerance"]
        diff.axhspan(-tolerance, tolerance, color="green", alpha=0.1, label=f"±{tolerance:g} %")
        diff.set_ylabel(f"({names[0]} − {names[1]}) / {names[1]}, %, mean of {window} steps")
        diff.legend(fontsize=8)
    diff.axhline(0, color="grey", linewidth=0.5)
    diff.set_xlabel("step")
    diff.grid(alpha=0.3)
    c = result["config"]
    fig.suptitle(
        f"GPT {c['layers']}x{c['width']}, {c['heads']} heads of {c['head_dim']}, "
        f"{c['batch']} x {c['seq_len']} tokens per step, {result['gpu']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, help="training steps per run (default 400; 60 with --quick)")
    parser.add_argument("--batch", type=int, help="sequences per step (default 16; 4 with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="the model's and the data's seed")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1] / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="a short smoke test; the loss check is skipped")
    parser.add_argument("--impls", nargs=2, choices=list(ATTENTION), default=["fa3", "cudnn"])
    parser.add_argument("--tolerance", type=float, default=0.01, help="largest relative difference of the final losses")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up steps")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--successors", type=int, default=32, help="successors of each token in the chain")
    parser.add_argument("--log-every", type=int, default=25, help="print the loss every this many steps")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    args.steps = args.steps or (60 if args.quick else 400)
    args.batch = args.batch or (4 if args.quick else 16)
    if args.steps < 11:
        parser.error("--steps: at least 11 (the first 10 are left out of tokens/s)")
    if args.seq_len % 2 or args.head_dim % 2:
        parser.error("--seq-len and --head-dim must be even")
    if not 1 <= args.successors <= args.vocab:
        parser.error("--successors: between 1 and --vocab")
    if args.impls[0] == args.impls[1]:
        parser.error("--impls: two different implementations")
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("train_gpt.py: no CUDA GPU (--device cpu runs fa3's CPU path, for small sizes)")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{gpu}; torch {torch.__version__}; fa3 {fa3.__version__}", flush=True)

    task = MarkovCopyTask(args.vocab, args.successors, args.seed)
    data = task.sequences(args.steps * args.batch, args.seq_len).view(args.steps, args.batch, -1)
    if device.type == "cuda":
        data = data.pin_memory()
    floor = task.loss_floor(data.flatten(0, 1))
    config = {k: v for k, v in vars(args).items() if k not in ("out_dir", "log_every", "device", "impls")}
    print(
        f"{args.layers} layers x {args.width}, {args.heads} heads of {args.head_dim}, {args.batch} x "
        f"{args.seq_len} tokens per step, {args.steps} steps; loss starts near ln({args.vocab}) = "
        f"{math.log(args.vocab):.2f}, floor {floor:.3f}",
        flush=True,
    )

    runs = {}
    for impl in args.impls:
        print(f"{LABELS[impl]}:", flush=True)
        try:
            runs[impl] = train(impl, data, args, device)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            print(f"  {impl} failed: {type(e).__name__}: {e}", flush=True)
            runs[impl] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()

    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "gpu": gpu,
        "torch": torch.__version__,
        "fa3": fa3.__version__,
        "config": config,
        "loss_floor": floor,
        "tolerance": args.tolerance,
        "runs": runs,
    }
    failed = [impl for impl, run in runs.items() if "error" in run]
    a, b = args.impls
    if not failed:
        difference = abs(runs[a]["final_loss"] - runs[b]["final_loss"]) / runs[b]["final_loss"]
        result["final_relative_difference"] = difference
        result["passed"] = None if args.quick else difference <= args.tolerance
        for impl in args.impls:
            run = runs[impl]
            memory = f", peak memory {run['peak_memory_bytes'] / 2**30:.1f} GiB" if "peak_memory_bytes" in run else ""
            print(
                f"{LABELS[impl]:24s} final loss {run['final_loss']:.4f}, {run['tokens_per_s']:,.0f} tokens/s, "
                f"{run['seconds']:.0f} s{memory}"
            )
        verdict = "not checked (--quick)" if args.quick else ("ok" if result["passed"] else "FAILED")
        print(f"final losses differ by {100 * difference:.2f} % (tolerance {100 * args.tolerance:g} %): {verdict}")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    stem = f"{datetime.date.today().isoformat()}-{slug}-train" + ("-quick" if args.quick else "")
    json_path = args.out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {json_path}")
    try:
        plot(result, args.out_dir / f"{stem}.png")
        print(f"wrote {args.out_dir / f'{stem}.png'}")
    except ImportError as e:
        print(f"no plot ({e})")
    if failed or result.get("passed") is False:
        sys.exit(1)


if __name__ == "__main__":
    main()
