"""fa3 as the flash backend of PyTorch's scaled_dot_product_attention.

    import fa3.integrations.sdpa
    fa3.integrations.sdpa.register()                     # offers "fa3" to torch
    torch.nn.attention.activate_flash_attention_impl("fa3")
    ...                                                  # SDPA's flash backend runs fa3
    torch.nn.attention.restore_flash_attention_impl()    # back to torch's own kernels

Activation installs, through torch.library, fa3 kernels for the aten operators that
the flash backend calls, forward and backward: on CUDA those of the GPU flash backend
(_scaled_dot_product_flash_attention, and _flash_attention_forward for
torch.nn.attention.varlen), on the CPU the CPU flash backend's
_scaled_dot_product_flash_attention_for_cpu. Torch still picks the backend: fa3 runs
where torch would have run its flash kernels. Restoring removes the kernels.

What fa3 cannot run raises NotImplementedError naming it, rather than silently running
something else: dropout, a causal mask with more keys than queries (SDPA aligns it to
the top-left corner, fa3 to the bottom-right), ALiBi, paged K/V with packed queries, and
what fa3's own calls refuse (on CUDA, the backward of variable-length batches runs at
head dim 128). Torch's CPU flash backend also takes explicit masks, which fa3 does not;
such calls are computed in plain float32 arithmetic instead.
"""

import torch

from .. import _checks, _torch_ops, _torch_varlen_ops, interface

NAME = "fa3"


def register():
    """Offers fa3 to torch.nn.attention under the name "fa3"; idempotent. Activating it
    is the user's choice (torch.nn.attention.activate_flash_attention_impl("fa3"))."""
    attention = torch.nn.attention
    if not hasattr(attention, "register_flash_attention_impl"):
        raise ImportError(
            "fa3.integrations.sdpa needs torch.nn.attention.register_flash_attention_impl, "
            f"which PyTorch {torch.__version__} does not have"
        )
    attention.register_flash_attention_impl(NAME, register_fn=_install)


class _Handle:
    """What torch keeps while fa3 is active; remove() drops the kernels: a
    torch.library.Library unregisters them when it is freed, and nothing else holds one."""

    def __init__(self, libraries):
        self._libraries = libraries

    def remove(self):
        self._libraries = []


def _install():
    cuda = torch.library.Library("aten", "IMPL", "CUDA")
    cuda.impl("_scaled_dot_product_flash_attention", _sdpa_forward, "CUDA")
    cuda.impl("_scaled_dot_product_flash_attention_backward", _sdpa_backward, "CUDA")
    cuda.impl("_flash_attention_forward", _flash_forward, "CUDA")
    cuda.impl("_flash_attention_backward", _flash_backward, "CUDA")
    cuda.impl("_flash_attention_forward_no_dropout_inplace", _flash_forward_into, "CUDA")
    cpu = torch.library.Library("aten", "IMPL", "CPU")
    cpu.impl("_scaled_dot_product_flash_attention_for_cpu", _sdpa_cpu_forward, "CPU")
    cpu.impl("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_cpu_backward, "CPU")
    return _Handle([cuda, cpu])


def _refuse_dropout(dropout_p):
    if dropout_p:
        raise NotImplementedError(
            f"dropout_p: fa3 has no attention dropout (got {dropout_p}); "
            "torch.nn.attention.restore_flash_attention_impl() gives torch's flash kernels back"
        )


def _sdpa_mask(is_causal, seqlen_q, seqlen_k):
    """(causal, window_size) for fa3 of SDPA's causal mask, which aligns to the top-left
    corner: query i sees keys j <= i. fa3 aligns to the bottom-right one, the same when
    the lengths are equal; with more queries than keys a right window of seqlen_q -
    seqlen_k moves the diagonal back."""
    if not is_causal or seqlen_q == seqlen_k:
        return bool(is_causal), (-1, -1)
    if seqlen_k > seqlen_q:
        raise NotImplementedError(
            f"is_causal: SDPA's causal mask with more keys ({seqlen_k}) than queries ({seqlen_q}) "
            "is aligned to the top-left corner, which fa3 does not offer; pass an explicit mask "
            "to another backend"
        )
    return False, (-1, seqlen_q - seqlen_k)


def _sdpa_run(query, key, value, is_causal, scale):
    """(out, lse) of SDPA-layout (batch, heads, seq, d) inputs: out in the same layout,
    lse (batch, heads, seq_q)."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    causal, window = _sdpa_mask(is_causal, q.shape[1], k.shape[1])
    out, lse = interface.flash_attn_func(
        q, k, v, softmax_scale=scale, causal=causal, window_size=window, return_attn_probs=True
    )
    return out.transpose(1, 2), lse


def _sdpa_gradients(grad_out, query, key, value, out, logsumexp, is_causal, scale):
    """(dq, dk, dv) in SDPA's layout, from fa3's backward on the transposed views."""
    dout, q, k, v, o = (t.transpose(1, 2) for t in (grad_out, query, key, value, out))
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    causal, window = _sdpa_mask(is_causal, q.shape[1], k.shape[1])
    dq, dk, dv, _ = _backward(dout, q, k, v, o, logsumexp, scale, causal, window)
    return tuple(t.transpose(1, 2) for t in (dq, dk, dv))


def _backward(dout, q, k, v, out, lse, scale, causal, window_size):
    is_causal, left, right = _checks.mask_args(causal, window_size, q.shape[1], k.shape[1])
    scale = 0.0 if scale is None else float(scale)
    return _torch_ops.attention_backward(dout, q, k, v, out, lse, None, scale, is_causal, left, right, 0.0, False, 0)


def _sdpa_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    _refuse_dropout(dropout_p)
    out, lse = _sdpa_run(query, key, value, is_causal, scale)
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    # No varlen bounds and no random state: empty tensors where torch's kernel returns them.
    empty = query.new_empty(0, dtype=torch.int64)
    return out, lse, empty, empty, seqlen_q, seqlen_k, empty, empty, query.new_empty(0)


def _sdpa_backward(
    grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    philox_seed, philox_offset, *, scale=None,
):
    _refuse_dropout(dropout_p)
    return _sdpa_gradients(grad_out, query, key, value, out, logsumexp, is_causal, scale)


def _sdpa_cpu_forward(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _refuse_dropout(dropout_p)
    if attn_mask is not None:
        return _masked_forward(query, key, value, attn_mask, is_causal, scale)
    return _sdpa_run(query, key, value, is_causal, scale)


def _sdpa_cpu_backward(
    grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    _refuse_dropout(dropout_p)
    if attn_mask is not None:
        return _masked_backward(grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, scale)
    return _sdpa_gradients(grad_out, query, key, value, out, logsumexp, is_causal, scale)


# torch's CPU flash backend takes explicit masks, which fa3 does not, and an override
# cannot hand the call back to the kernel it replaced: such calls are computed here,
# plainly in float32, so that SDPA on CPU tensors with a mask (transformers' "sdpa"
# models, for one) keeps working while fa3 is active.


def _masked_scores(query, key, attn_mask, is_causal, scale):
    """Scaled, masked float32 scores (batch, heads, seq_q, seq_k), key heads repeated for GQA."""
    groups = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(groups, dim=1)
    scores = (query.float() @ k.transpose(-2, -1)) * (query.shape[-1] ** -0.5 if scale is None else scale)
    if attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    else:
        scores = scores + attn_mask.float()
    if is_causal:
        above = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    return scores


def _masked_probabilities(scores, lse):
    # A row that sees no key gives 0, as fa3's kernels do, not NaN.
    return torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)


def _masked_forward(query, key, value, attn_mask, is_causal, scale):
    scores = _masked_scores(query, key, attn_mask, is_causal, scale)
    lse = scores.logsumexp(dim=-1)
    groups = query.shape[1] // value.shape[1]
    out = _masked_probabilities(scores, lse) @ value.float().repeat_interleave(groups, dim=1)
    return out.to(query.dtype), lse


def _masked_backward(grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, scale):
    scores = _masked_scores(query, key, attn_mask, is_causal, scale)
    probabilities = _masked_probabilities(scores, logsumexp)
    groups = query.shape[1] // key.shape[1]
    k, v = (t.float().repeat_interleave(groups, dim=1) for t in (key, value))
    dout = grad_out.float()
    # softmax's backward: dS = P * (dP - rowsum(dO * O)).
    dscores = probabilities * (dout @ v.transpose(-2, -1) - (dout * out.float()).sum(-1, keepdim=True))
    dscores = dscores * (query.shape[-1] ** -0.5 if scale is None else scale)
    dq = dscores @ k
    dk, dv = (dscores.transpose(-2, -1) @ query.float(), probabilities.transpose(-2, -1) @ dout)
    # A key head's gradient sums over its group of query heads.
    dk, dv = (t.unflatten(1, (key.shape[1], groups)).sum(2) for t in (dk, dv))
    return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype)


def _window(left, right):
    return (-1 if left is None else left, -1 if right is None else right)


def _flash_forward(
    query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
    scale=None, window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None,
    block_table=None, num_splits=None,
):
    """aten's flash forward in FlashAttention's own layout, (batch, seq, heads, d) or,
    with cum_seq_q, packed (total, heads, d); causal aligned to the bottom-right corner."""
    _refuse_dropout(dropout_p)
    if alibi_slopes is not None or block_table is not None:
        raise NotImplementedError(
            "alibi_slopes, block_table: fa3 implements neither ALiBi nor paged K/V with packed queries yet "
            "(fa3.flash_attn_with_kvcache takes paged caches)"
        )
    options = {
        "softmax_scale": scale,
        "causal": bool(is_causal),
        "window_size": _window(window_size_left, window_size_right),
    }
    if cum_seq_q is None:
        out, lse = interface.flash_attn_func(query, key, value, return_attn_probs=True, **options)
    else:
        out, lse = interface.flash_attn_varlen_func(
            query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, seqused_k=seqused_k,
            num_splits=num_splits or 1, return_attn_probs=True, **options,
        )
    empty = query.new_empty(0, dtype=torch.int64)
    return out, lse, empty, empty, query.new_empty(0)


def _flash_forward_into(out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                        return_debug_mask, **options):
    result, lse, *_ = _flash_forward(
        query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, **options
    )
    out.copy_(result)
    return lse


def _flash_backward(
    grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None,
):
    _refuse_dropout(dropout_p)
    window = _window(window_size_left, window_size_right)
    if cum_seq_q is not None and cum_seq_q.numel():
        # A packed batch (torch.nn.attention.varlen): fa3's varlen backward, the mask
        # resolved against the bounds as the forward resolved it.
        causal, left, right = _checks.mask_args(is_causal, window, max_q, max_k)
        dq, dk, dv, _ = _torch_varlen_ops.varlen_backward(
            grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous(), query, key, value, out, logsumexp,
            cum_seq_q, cum_seq_k, None, None, max_q, max_k, None, 0.0 if scale is None else float(scale), causal, left,
            right, 0.0, False, 0,
        )
        return dq, dk, dv
    dq, dk, dv, _ = _backward(grad_out, query, key, value, out, logsumexp, scale, is_causal, window)
    return dq, dk, dv
