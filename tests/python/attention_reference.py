"""The reference attention and the accuracy rule of docs TESTING.md, in torch.

reference() computes attention straight from its definition in a chosen dtype:
float32/float64 for `ref`, the inputs' own dtype for `low` (what a naive
implementation in that precision gets). check_close() applies the rule
    max|out - ref| <= factor * max|low - ref| + 1e-5
plus an absolute cap for 16-bit outputs; NaN never passes.
"""

import math

import torch

ABS_CAP = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def allowed_keys(seqlen_q, seqlen_k, causal=False, window=(-1, -1), device="cpu", chunk=0):
    """Bool (seqlen_q, seqlen_k): may query i see key j (bottom-right aligned; with
    chunk > 0 only keys of the query's own chunk)."""
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    left, right = window
    if causal:
        right = 0
    allowed = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    if chunk > 0:
        allowed &= torch.div(j, chunk, rounding_mode="floor") == torch.div(i, chunk, rounding_mode="floor")
    return allowed


def reference(
    q, k, v, *, dtype, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, sinks=None, chunk=0
):
    """(out, lse) for q (b, sq, h, d), k/v (b, sk, hk, d), computed in `dtype`.

    out comes back in `dtype`, lse in float32 (natural log). Rows that see no key
    give out 0 and lse -inf (their sink with sinks), as fa3 promises. sinks: None
    or float32 (h,), each head's logit in every row's denominator (fa3/attention.h).
    """
    seqlen_q, nheads, head_dim = q.shape[1], q.shape[2], q.shape[3]
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    group = nheads // nheads_k
    qf = q.to(dtype)
    kf = k.to(dtype).repeat_interleave(group, dim=2)
    vf = v.to(dtype).repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = allowed_keys(seqlen_q, seqlen_k, causal, window, device=q.device, chunk=chunk)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs, lse = _probabilities(scores, allowed, sinks)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, vf)
    return out, lse


def _probabilities(scores, allowed, sinks):
    """(probs in scores' dtype, lse in float32) of masked scores (b, h, sq, sk).

    A sink joins each row's denominator as the float32 value it is (a naive
    implementation would not round an input that no matrix product reads) and is
    left out of probs; a 16-bit `low` rounds the probabilities once, as softmax does."""
    seen = allowed.any(dim=-1)[None, None, :, None]
    if sinks is None:
        lse = torch.logsumexp(scores.float(), dim=-1)
        return torch.softmax(scores, dim=-1).masked_fill(~seen, 0.0), lse
    wide = scores if scores.dtype == torch.float64 else scores.float()
    sink = sinks.to(wide.dtype)[None, :, None, None].expand(*wide.shape[:3], 1)
    lse = torch.logsumexp(torch.cat([wide, sink], dim=-1), dim=-1)
    probs = torch.exp(wide - lse[..., None]).masked_fill(~seen, 0.0)
    return probs.to(scores.dtype), lse.float()


def reference_grads(q, k, v, dout, *, dtype, sinks=None, **mask):
    """dq, dk, dv (and dsinks, with sinks) of sum(out * dout) through reference(),
    computed and returned in `dtype` (dsinks in float32 for 16-bit dtypes).

    float32/float64 differentiate reference() with autograd. 16-bit dtypes (`low`)
    compute what the C++ references do (src/reference/naive.cpp): dS = P * (dP - D)
    with D = rowsum(dout * out) in float32 from the forward's rounded output, and P,
    dP and dS rounded to the dtype; dsinks = -sum over rows of exp(sink - lse) * D in
    float32. Autograd through softmax would take D = rowsum(P * dP) instead, which
    cancels exactly where P is exactly 1 (every row when there is a single key): its
    `low` would then claim a precision that no computation of D from out can reach.
    """
    if dtype in (torch.float32, torch.float64):
        tensors = (q, k, v) if sinks is None else (q, k, v, sinks)
        leaves = [t.detach().to(dtype).requires_grad_() for t in tensors]
        out, _ = reference(*leaves[:3], dtype=dtype, sinks=None if sinks is None else leaves[3], **mask)
        out.backward(dout.to(dtype))
        return [t.grad for t in leaves]
    return _flash_grads(q, k, v, dout, dtype=dtype, sinks=sinks, **mask)


def _flash_grads(
    q, k, v, dout, *, dtype, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, sinks=None, chunk=0
):
    seqlen_q, nheads, head_dim = q.shape[1], q.shape[2], q.shape[3]
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    group = nheads // nheads_k
    out, lse = reference(
        q,
        k,
        v,
        dtype=dtype,
        softmax_scale=softmax_scale,
        causal=causal,
        window=window,
        softcap=softcap,
        sinks=sinks,
        chunk=chunk,
    )
    qf, do = q.to(dtype), dout.to(dtype)
    kf = k.to(dtype).repeat_interleave(group, dim=2)
    vf = v.to(dtype).repeat_interleave(group, dim=2)
    raw = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    capped = softcap * torch.tanh(raw / softcap) if softcap > 0 else raw
    allowed = allowed_keys(seqlen_q, seqlen_k, causal, window, device=q.device, chunk=chunk)
    scores = capped.masked_fill(~allowed, float("-inf"))
    probs, _ = _probabilities(scores, allowed, sinks)
    dv = torch.einsum("bhqk,bqhd->bkhd", probs, do)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vf)
    d = (do.float() * out.float()).sum(dim=-1).transpose(1, 2)[..., None]  # (b, h, sq, 1), float32
    ds = probs.float() * (dp.float() - d)
    if softcap > 0:
        ds = ds * (1 - (capped.float() / softcap) ** 2)
    ds = ds.to(dtype)
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kf) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, qf) * scale

    def sum_group(t):
        b, s, _, dim = t.shape
        return t.view(b, s, nheads_k, group, dim).sum(dim=3)

    grads = [dq, sum_group(dk), sum_group(dv)]
    if sinks is not None:
        grads.append(-(torch.exp(sinks.float()[None, :, None] - lse) * d[..., 0]).sum(dim=(0, 2)))
    return grads


def max_abs_error(a, b):
    """max |a - b| in float64, where equal infinities count as no error."""
    a, b = a.double(), b.double()
    same_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    diff = torch.where(same_inf, torch.zeros_like(a), (a - b).abs())
    if torch.isnan(diff).any():
        return math.inf
    return diff.max().item() if diff.numel() else 0.0


def check_close(name, out, ref, low, factor=2.0, abs_cap=None):
    """Asserts the accuracy rule for one output tensor."""
    assert not torch.isnan(out).any(), f"{name}: NaN in fa3's result"
    err = max_abs_error(out, ref)
    low_err = max_abs_error(low, ref)
    bound = factor * low_err + 1e-5
    assert err <= bound, f"{name}: max|out - ref| = {err:.3g} exceeds {factor} * {low_err:.3g} + 1e-5"
    if abs_cap is not None:
        assert err <= abs_cap, f"{name}: max|out - ref| = {err:.3g} exceeds the absolute cap {abs_cap}"


def reference_dtype(dtype):
    """The precision of `ref` for inputs of `dtype`: above the inputs' own."""
    return torch.float64 if dtype == torch.float32 else torch.float32
