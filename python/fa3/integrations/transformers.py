"""fa3 as an attention implementation of Hugging Face transformers.

    import fa3.integrations.transformers
    fa3.integrations.transformers.register()        # once, before loading models
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="fa3")

register() adds an attention function to transformers' AttentionInterface and, under
the same name, a mask function to its AttentionMaskInterface. The mask function is the
one transformers gives its flash-attention implementations: models then hand the
attention function a 2-d padding mask (batch, kv_len), or None when nothing is padded,
instead of a dense 4-d mask that fa3 would have no use for.

The attention function runs fa3.flash_attn_func when every sequence fills its row, and
fa3.flash_attn_varlen_func on the tokens alone otherwise: padded batches (the 2-d mask)
and packed ones (several sequences in a row, told by position_ids restarting, or by the
cu_seq_lens_q / cu_seq_lens_k keywords of transformers' DataCollatorWithFlattening).
Causal masking, GQA, sliding windows and logit softcapping come from the layer. CPU
tensors run fa3's CPU path; CUDA tensors fa3's kernels, varlen ones where the build has
the GPU varlen paths (fa3.build_info()["gpu_varlen"]) and, when gradients are wanted, the
head dim runs on a kernel with a GPU varlen backward (build_info()'s
"gpu_varlen_backward_head_dims"); otherwise a padded or packed batch runs one
flash_attn_func call per sequence.
"""

import torch

from .. import interface
from .._info import build_info

_PACKED_KEYWORDS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def register(name="fa3"):
    """Makes attn_implementation=name select fa3 in transformers models. Idempotent; the
    name may be any string that is not one of transformers' own implementations."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as error:
        raise ImportError(
            "fa3.integrations.transformers needs Hugging Face transformers (pip install transformers)"
        ) from error
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function protocol on fa3.

    query (batch, heads, q_len, d), key and value (batch, kv_heads, kv_len, d), heads a
    multiple of kv_heads (the layer's num_key_value_groups; fa3 reads the shared heads
    in place). attention_mask: None or the 2-d padding mask (batch, kv_len), True or 1
    where a token is. Returns (out (batch, q_len, heads, d), None): fa3 never forms the
    attention weights.
    """
    if dropout:
        raise NotImplementedError(
            f"dropout: fa3 has no attention dropout (got {dropout}); set the model's attention_dropout to 0"
        )
    if kwargs.get("output_attentions"):
        raise NotImplementedError("output_attentions: fa3 never forms the attention weights; use eager attention")
    options = _layer_options(module, scaling, kwargs)
    # fa3 takes (batch, seq, heads, d); transposes are views, and its kernels need only
    # the head dim contiguous.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    if attention_mask is not None:
        return _padded_attention(q, k, v, attention_mask, options), None
    packed = _packed_bounds(q, k, kwargs)
    if packed is not None:
        return _packed_attention(q, k, v, packed, options), None
    return interface.flash_attn_func(q, k, v, **options), None


def _layer_options(module, scaling, kwargs):
    """fa3's keywords for the layer: a keyword the model passes wins over the layer's
    attribute (Gemma 2 passes sliding_window and softcap; Mistral sets sliding_window on
    the layer)."""
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    sliding_window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    softcap = kwargs.get("softcap", getattr(module, "attn_logit_softcapping", None))
    # transformers' sliding window of w lets query i see keys i - w + 1 .. i.
    window = (sliding_window - 1, 0 if causal else sliding_window - 1) if sliding_window else (-1, -1)
    return {
        "softmax_scale": scaling,
        "causal": bool(causal),
        "window_size": window,
        "softcap": float(softcap or 0.0),
    }


def _padded_attention(q, k, v, attention_mask, options):
    """Attention over the unpadded tokens of each row; padded query rows give zeros."""
    if attention_mask.dim() != 2 or attention_mask.shape[0] != q.shape[0]:
        raise ValueError(
            f"attention_mask: fa3 takes a 2-d padding mask (batch, kv_len), got shape {tuple(attention_mask.shape)}; "
            "register() sets the mask function that gives models one"
        )
    batch, q_len, kv_len = q.shape[0], q.shape[1], k.shape[1]
    # The mask covers the keys, cache included; the queries are its last q_len columns.
    keys_kept = attention_mask[:, -kv_len:].bool()
    queries_kept = attention_mask[:, -q_len:].bool()
    rows_q, cu_q, max_q = _unpad_index(queries_kept)
    rows_k, cu_k, max_k = _unpad_index(keys_kept)
    out = _varlen(_gather(q, rows_q), _gather(k, rows_k), _gather(v, rows_k), (cu_q, cu_k, max_q, max_k), options)
    padded = out.new_zeros((batch * q_len,) + tuple(out.shape[1:]))
    return padded.index_copy(0, rows_q, out).view(batch, q_len, *out.shape[1:])


def _unpad_index(kept):
    """(flat indices of the kept tokens, cu_seqlens int32, longest row) of a (batch, len)
    boolean mask; the kept tokens of each row are one sequence."""
    lengths = kept.sum(dim=1, dtype=torch.int32)
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    rows = kept.flatten().nonzero().flatten()
    return rows, cu_seqlens, int(lengths.max()) if lengths.numel() else 0


def _gather(t, rows):
    # (batch, len, heads, d) to the packed (tokens, heads, d) of the kept rows.
    return t.reshape(-1, *t.shape[2:]).index_select(0, rows)


def _packed_bounds(q, k, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) when the batch packs several sequences
    per row, else None: from transformers' flattening keywords when given, or from
    position_ids, a sequence starting wherever a position does not follow the one before."""
    given = [kwargs.get(key) for key in _PACKED_KEYWORDS]
    if all(value is not None for value in given):
        cu_q, cu_k, max_q, max_k = given
        return cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)
    position_ids = kwargs.get("position_ids")
    if position_ids is None or q.shape[1] != k.shape[1] or q.shape[1] < 2:
        return None
    positions = position_ids.expand(q.shape[0], -1)
    if bool((positions.diff(dim=-1) == 1).all()):
        return None
    flat = positions.flatten()
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1] + 1
    # Each row starts a sequence too, whatever its first position.
    starts[:: q.shape[1]] = True
    bounds = torch.cat([starts.nonzero().flatten(), flat.new_tensor([flat.numel()])]).to(torch.int32)
    longest = int(bounds.diff().max())
    return bounds, bounds, longest, longest


def _packed_attention(q, k, v, packed, options):
    cu_q, cu_k, max_q, max_k = packed
    batch, q_len = q.shape[0], q.shape[1]
    out = _varlen(*(t.reshape(-1, *t.shape[2:]) for t in (q, k, v)), packed, options)
    return out.view(batch, q_len, *out.shape[1:])


def _varlen(q, k, v, bounds, options):
    """flash_attn_varlen_func on packed (tokens, heads, d) tensors, or on CUDA where fa3's
    GPU varlen paths do not take the call (_gpu_varlen_runs), flash_attn_func on each
    sequence in turn."""
    if q.device.type != "cuda" or _gpu_varlen_runs(q, k, v):
        return interface.flash_attn_varlen_func(q, k, v, *bounds, **options)
    return _varlen_by_sequence(q, k, v, bounds[0], bounds[1], options)


def _gpu_varlen_runs(q, k, v):
    """Whether fa3's GPU varlen paths take a packed call of these tensors, forward and, if
    gradients are wanted, backward."""
    info = build_info()
    if not info["gpu_varlen"]:
        return False
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if not wants_grad:
        return True
    # The backward runs on the smallest built head dim that holds both of the call's
    # (fa3/attention.h); its varlen instance may not have been built.
    wider = [d for d in info["head_dims"] if d >= max(q.shape[-1], v.shape[-1])]
    return bool(wider) and min(wider) in info["gpu_varlen_backward_head_dims"]


def _varlen_by_sequence(q, k, v, cu_q, cu_k, options):
    # The packed tokens are exactly the sequences' (cu_seqlens_q[-1] is the total), so
    # the pieces concatenate to the packed output.
    outs = [q.new_zeros((0, q.shape[1], v.shape[-1]))]
    for q_range, k_range in zip(_ranges(cu_q), _ranges(cu_k)):
        q_seq = q[slice(*q_range)].unsqueeze(0)
        if q_range[0] == q_range[1]:
            continue
        if k_range[0] == k_range[1]:
            # No key: the rows give 0, as the varlen call's would.
            outs.append(q_seq.new_zeros((q_seq.shape[1], q.shape[1], v.shape[-1])))
        else:
            k_seq, v_seq = (t[slice(*k_range)].unsqueeze(0) for t in (k, v))
            outs.append(interface.flash_attn_func(q_seq, k_seq, v_seq, **options)[0])
    return torch.cat(outs)


def _ranges(cu_seqlens):
    bounds = cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))
