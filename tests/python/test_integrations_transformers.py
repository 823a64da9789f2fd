"""attn_implementation="fa3" in Hugging Face transformers: tiny random-weight models give
the logits and training losses of transformers' own eager and sdpa attention, with and
without padding, with packed sequences, GQA, sliding windows and softcapping. Skipped
when transformers is not installed.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import fa3  # noqa: E402
import fa3.integrations.transformers as fa3_transformers  # noqa: E402
from gpu_support import gpu_skip_reason  # noqa: E402

fa3_transformers.register()

VOCAB = 97
# fp32 on the CPU: fa3's CPU path and torch's attention differ only in summation order.
CPU_TOLERANCE = 2e-5
# Gemma 2's softcapping has no sdpa implementation in transformers: eager only.
CASES = [("llama", "eager"), ("llama", "sdpa"), ("mistral", "eager"), ("mistral", "sdpa"), ("gemma2", "eager")]


def _config(kind, attn_implementation):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        attn_implementation=attn_implementation,
    )
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "mistral":
        return transformers.MistralConfig(sliding_window=5, **common)
    if kind == "gemma2":
        # Alternating sliding and full layers, both softcapped.
        return transformers.Gemma2Config(
            sliding_window=5, attn_logit_softcapping=3.0, query_pre_attn_scalar=16, **common
        )
    raise ValueError(kind)


def _model(kind, attn_implementation, dtype=torch.float32, device="cpu", seed=0):
    """The same random weights for every implementation (the same seed), drawn in
    float32 and then rounded to dtype."""
    torch.manual_seed(seed)
    config = _config(kind, attn_implementation)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(device=device, dtype=dtype).eval()


def _logits(model, input_ids, **inputs):
    with torch.no_grad():
        return model(input_ids=input_ids, **inputs).logits


def _max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def _tokens(batch, length, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=generator)


def test_register_adds_the_name_and_is_idempotent():
    fa3_transformers.register()
    fa3_transformers.register()
    assert "fa3" in transformers.AttentionInterface()
    assert transformers.AttentionInterface()["fa3"] is fa3_transformers.attention_forward


@pytest.mark.parametrize("kind, reference", CASES)
def test_logits_without_padding(kind, reference):
    input_ids = _tokens(2, 13)
    got = _logits(_model(kind, "fa3"), input_ids)
    want = _logits(_model(kind, reference), input_ids)
    assert _max_diff(got, want) <= CPU_TOLERANCE


@pytest.mark.parametrize("kind, reference", CASES)
def test_logits_with_left_padding(kind, reference):
    input_ids = _tokens(3, 11)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :4] = 0
    attention_mask[2, :10] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    inputs = dict(attention_mask=attention_mask, position_ids=position_ids)
    got = _logits(_model(kind, "fa3"), input_ids, **inputs)
    want = _logits(_model(kind, reference), input_ids, **inputs)
    # Padded positions carry no meaning (fa3 gives them zero attention output).
    kept = attention_mask.bool()
    assert _max_diff(got[kept], want[kept]) <= CPU_TOLERANCE


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_packed_sequences_equal_separate_runs(kind):
    lengths = [5, 7, 1, 3]
    input_ids = _tokens(1, sum(lengths))
    position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    got = _logits(_model(kind, "fa3"), input_ids, position_ids=position_ids)
    reference = _model(kind, "eager")
    start = 0
    for n in lengths:
        alone = _logits(reference, input_ids[:, start : start + n])
        assert _max_diff(got[:, start : start + n], alone) <= CPU_TOLERANCE
        start += n


def test_packed_sequences_from_flattening_keywords():
    lengths = [4, 6, 3]
    input_ids = _tokens(1, sum(lengths))
    bounds = torch.tensor([0, 4, 10, 13], dtype=torch.int32)
    packed = dict(cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=6, max_length_k=6)
    got = _logits(_model("llama", "fa3"), input_ids, **packed)
    reference = _model("llama", "eager")
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        alone = _logits(reference, input_ids[:, start:end])
        assert _max_diff(got[:, start:end], alone) <= CPU_TOLERANCE


@pytest.mark.parametrize("causal, window_size, softcap", [(True, (-1, -1), 0.0), (False, (2, 1), 5.0)])
def test_per_sequence_loop_equals_the_varlen_call(causal, window_size, softcap):
    # What CUDA tensors run where fa3's GPU varlen paths do not take the call, checked on
    # the CPU.
    cu_q = torch.tensor([0, 3, 3, 9, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 12, 12], dtype=torch.int32)
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(10, 4, 16, generator=generator)
    k, v = (torch.randn(12, 2, 16, generator=generator) for _ in range(2))
    options = dict(softmax_scale=0.2, causal=causal, window_size=window_size, softcap=softcap)
    got = fa3_transformers._varlen_by_sequence(q, k, v, cu_q, cu_k, options)
    want = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 6, **options)
    assert _max_diff(got, want) <= 1e-6


def test_gpu_varlen_is_taken_where_the_build_runs_it(monkeypatch):
    """CUDA calls go to the varlen kernels in a build with them, for gradients only where
    the call's kernel head dim has a GPU varlen backward; the rule itself needs no GPU."""
    q, k, v = (torch.zeros(10, 2, d) for d in (128, 128, 128))
    info = {"gpu_varlen": False, "head_dims": [64, 96, 128, 192, 256], "gpu_varlen_backward_head_dims": [128]}
    monkeypatch.setattr(fa3_transformers, "build_info", lambda: info)
    assert not fa3_transformers._gpu_varlen_runs(q, k, v)
    info["gpu_varlen"] = True
    assert fa3_transformers._gpu_varlen_runs(q, k, v)
    narrow = torch.zeros(10, 2, 64)
    assert fa3_transformers._gpu_varlen_runs(narrow, narrow, narrow), "no gradient wanted: any head dim"
    grad = [t.clone().requires_grad_() for t in (q, k, v)]
    assert fa3_transformers._gpu_varlen_runs(*grad)
    narrow_grad = narrow.clone().requires_grad_()
    assert not fa3_transformers._gpu_varlen_runs(narrow_grad, narrow, narrow)
    with torch.no_grad():
        assert fa3_transformers._gpu_varlen_runs(narrow_grad, narrow, narrow)
    # Head dim 112 (and V's 64 beside Q/K's 112) runs on the 128 kernel; 320 on none.
    odd = torch.zeros(10, 2, 112).requires_grad_()
    assert fa3_transformers._gpu_varlen_runs(odd, odd, narrow)
    wide = torch.zeros(10, 2, 320).requires_grad_()
    assert not fa3_transformers._gpu_varlen_runs(wide, wide, wide)
    info["gpu_varlen_backward_head_dims"] = [64, 128]
    assert fa3_transformers._gpu_varlen_runs(narrow_grad, narrow, narrow)


def _loss_curve(attn_implementation, steps=4):
    model = _model("llama", attn_implementation).train()
    # Plain SGD: Adam's update divides by the gradient's size, so that rounding-level
    # differences in near-zero gradients become full-size steps.
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    input_ids = _tokens(2, 12, seed=3)
    attention_mask = torch.ones_like(input_ids)
    # Right padding: no kept label is predicted from a padded position, whose output
    # carries no meaning.
    attention_mask[0, -3:] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_training_steps_give_the_loss_curve_of_eager():
    got, want = _loss_curve("fa3"), _loss_curve("eager")
    assert got == pytest.approx(want, rel=1e-4)
    # The model learns: the steps do change the weights.
    assert got[-1] < got[0]


def test_dropout_is_refused():
    model = _model("llama", "fa3").train()
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(NotImplementedError, match="dropout"):
        model(input_ids=_tokens(1, 4))


@pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
@pytest.mark.parametrize("kind", ["llama", "gemma2"])
@pytest.mark.parametrize("padded", [False, True])
def test_gpu_bf16_logits_within_the_noise_of_eager_and_sdpa(kind, padded):
    input_ids = _tokens(2, 200).cuda()
    attention_mask = torch.ones_like(input_ids)
    if padded:
        attention_mask[1, :37] = 0
    inputs = dict(attention_mask=attention_mask)
    kept = attention_mask.bool()
    reference = _logits(_model(kind, "eager", device="cuda"), input_ids, **inputs)[kept]
    # Gemma 2 has no sdpa attention in transformers.
    names = ("eager",) if kind == "gemma2" else ("eager", "sdpa")
    noise = max(
        _max_diff(_logits(_model(kind, name, torch.bfloat16, "cuda"), input_ids, **inputs)[kept], reference)
        for name in names
    )
    got = _logits(_model(kind, "fa3", torch.bfloat16, "cuda"), input_ids, **inputs)[kept]
    # Rounding compounds over the layers, so the bound is looser than a single call's 2x.
    assert _max_diff(got, reference) <= 3 * noise + 1e-5
