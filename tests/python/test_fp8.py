"""FP8 (e4m3) in Python: fa3.fp8.quantize (block scales, the random-sign Hadamard
transform) and flash_attn_func on e4m3 tensors with their scales, on the CPU path;
the GPU kernel of quantize against the CPU version, and on a Hopper GPU the FP8
attention kernel (a build with FA3_GPU_FP8) or its refusal (without).
"""

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from attention_reference import reference  # noqa: E402
from gpu_support import gpu_skip_reason  # noqa: E402

E4M3 = torch.float8_e4m3fn


def inputs(batch=1, seqlen_q=200, seqlen_k=300, nheads=4, nheads_k=2, head_dim=128, outliers=True, seed=0):
    """q, k, v ~ N(0, 1) with, as TESTING.md asks of FP8, 0.1 % of the entries 10x."""
    g = torch.Generator().manual_seed(seed)

    def one(shape):
        x = torch.randn(shape, generator=g)
        if outliers:
            x = torch.where(torch.rand(shape, generator=g) < 1e-3, 10 * x, x)
        return x

    return (
        one((batch, seqlen_q, nheads, head_dim)),
        one((batch, seqlen_k, nheads_k, head_dim)),
        one((batch, seqlen_k, nheads_k, head_dim)),
    )


def dequantize(codes, scale, block):
    """codes (b, s, h, d) times their block's scale (b, h, blocks), in float32."""
    per_row = scale.repeat_interleave(block, dim=2)[:, :, : codes.shape[1]]  # (b, h, s)
    return codes.float() * per_row.transpose(1, 2)[..., None]


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_hadamard_keeps_scores(head_dim):
    """The transform of q and k with one seed leaves q kᵀ unchanged to float32 rounding."""
    q, k, _ = inputs(seqlen_q=50, seqlen_k=60, head_dim=head_dim, outliers=False)
    hq, hk = fa3.fp8.hadamard_transform(q, seed=5), fa3.fp8.hadamard_transform(k, seed=5)
    scores = torch.einsum("bqhd,bkhd->bhqk", q[:, :, :2].double(), k.double())
    rotated = torch.einsum("bqhd,bkhd->bhqk", hq[:, :, :2].double(), hk.double())
    bound = 8 * 2.0**-24 * torch.einsum("bqhd,bkhd->bhqk", q[:, :, :2].double().abs(), k.double().abs())
    assert ((rotated - scores).abs() <= bound).all()
    assert not torch.equal(hq, q)


def test_quantize_follows_the_definition():
    """Scales are each block's absmax / 448 of the transformed rows, and the codes the
    e4m3 rounding (torch's own conversion) of the values over the scale."""
    q, k, v = inputs(seqlen_q=300, seqlen_k=129)
    qkv8 = fa3.fp8.quantize(q, k, v, block=128, hadamard=True, seed=3)
    assert qkv8.q.dtype == E4M3 and qkv8.q.shape == q.shape
    assert qkv8.q_scale.shape == (1, 4, 3) and qkv8.k_scale.shape == (1, 2, 2)
    for codes, scale, x in ((qkv8.q, qkv8.q_scale, fa3.fp8.hadamard_transform(q, 3)), (qkv8.v, qkv8.v_scale, v)):
        blocks = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, -x.shape[1] % 128)).unflatten(1, (-1, 128))
        absmax = blocks.abs().amax(dim=(2, 4)).transpose(1, 2)  # (b, h, blocks)
        assert torch.equal(scale, absmax / 448)
        inv = (448 / absmax).repeat_interleave(128, dim=2)[:, :, : x.shape[1]].transpose(1, 2)[..., None]
        assert torch.equal(codes.view(torch.uint8), (x * inv).to(E4M3).view(torch.uint8))


def test_signs_come_from_the_seed():
    q, k, v = inputs(seqlen_q=64, seqlen_k=64)
    first = fa3.fp8.quantize(q, k, v, seed=11)
    again = fa3.fp8.quantize(q, k, v, seed=11)
    other = fa3.fp8.quantize(q, k, v, seed=12)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(first[:3], again[:3]))
    assert not torch.equal(first.q.view(torch.uint8), other.q.view(torch.uint8))
    assert torch.equal(first.v.view(torch.uint8), other.v.view(torch.uint8)), "v is never transformed"
    assert fa3._C.hadamard_signs(11, 128) == fa3._C.hadamard_signs(11, 128)
    assert fa3._C.hadamard_signs(11, 128) != fa3._C.hadamard_signs(12, 128)


def fp8_reference(qkv8, **mask):
    """The exact attention of the dequantized inputs (the scores of the transformed q and
    k equal the original ones')."""
    q, k, v = (dequantize(c, s, qkv8.block) for c, s in zip(qkv8[:3], qkv8.block_scales))
    return reference(q.double(), k.double(), v.double(), dtype=torch.float64, **mask)


def gpu_lse_bound(qkv8, ref_lse):
    """Per row of lse (batch, heads, seqlen_q): how far the FP8 kernel's lse may be from
    the exact one. Hopper's FP8 MMA keeps about 14 bits while it accumulates, so a score
    errs by up to a few units of 2^-14 of sum_i |q_i k_i|, and the lse (a soft maximum of
    the scores) by at most the largest score error: 2^-12 of softmax_scale * |q_r| *
    max_j |k_j| over the head's keys (Cauchy-Schwarz), plus the final fp32 exp2/log2."""
    q, k, _ = (dequantize(c, s, qkv8.block).double() for c, s in zip(qkv8[:3], qkv8.block_scales))
    group = q.shape[2] // k.shape[2]
    q_norm = q.norm(dim=-1).transpose(1, 2)  # (batch, heads, seqlen_q)
    k_max = k.norm(dim=-1).amax(dim=1).repeat_interleave(group, dim=1)  # (batch, heads)
    scores = q_norm * k_max[:, :, None] / q.shape[-1] ** 0.5
    return 1e-5 + 1e-6 * ref_lse.abs() + scores * 2.0**-12


def assert_lse_within(lse, ref_lse, bound):
    """lse within `bound` of the reference row by row; a row that sees no key (reference
    -inf, as causal rows before the first key are) must be -inf too."""
    lse, ref_lse = lse.double(), ref_lse.double()
    empty = ref_lse == float("-inf")
    assert (lse[empty] == float("-inf")).all()
    assert ((lse[~empty] - ref_lse[~empty]).abs() <= bound[~empty]).all()


def relative_error(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hadamard", [False, True])
def test_flash_attn_func_runs_block_quantized_fp8(causal, hadamard):
    """The FP8 accuracy rule (TESTING.md): the reference from the quantized values, the
    relative error capped at 4e-2 (P's e4m3 rounding: tests/cpu/reference/test_fp8.cpp)."""
    q, k, v = inputs(head_dim=96)
    qkv8 = fa3.fp8.quantize(q, k, v, block=64, hadamard=hadamard, seed=1)
    out, lse = fa3.flash_attn_func(
        qkv8.q, qkv8.k, qkv8.v, causal=causal, block_scales=qkv8.block_scales, block_rows=64, return_attn_probs=True
    )
    assert out.dtype == torch.bfloat16 and out.shape == (1, 200, 4, 96) and lse.dtype == torch.float32
    ref_out, ref_lse = fp8_reference(qkv8, causal=causal)
    assert relative_error(out, ref_out) < 4e-2
    assert torch.allclose(lse.double(), ref_lse.double(), atol=1e-4, rtol=1e-5)


def test_flash_attn_func_takes_descales():
    """FlashAttention-3's per-(batch, kv head) descales: one scale per tensor here."""
    q, k, v = inputs(batch=2)
    codes, descales = [], []
    for x in (q, k, v):
        scale = x.abs().amax() / 448
        codes.append((x / scale).to(E4M3))
        descales.append(scale.expand(2, 2).contiguous())
    out = fa3.flash_attn_func(*codes, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    ref_out, _ = reference(*(c.double() * s[0, 0] for c, s in zip(codes, descales)), dtype=torch.float64)
    assert relative_error(out, ref_out) < 4e-2
    plain = fa3.flash_attn_func(*codes)
    assert not torch.equal(out, plain), "the descales must take effect"


def test_flash_attn_func_fp8_rules():
    q, k, v = inputs(seqlen_q=64, seqlen_k=64)
    qkv8 = fa3.fp8.quantize(q, k, v, block=32)
    with pytest.raises(ValueError, match=r"q_block_scale: shape \(1, 4, 2\) must be"):
        fa3.flash_attn_func(qkv8.q, qkv8.k, qkv8.v, block_scales=qkv8.block_scales)  # block_rows 128
    with pytest.raises(TypeError, match="block_scales: expected"):
        fa3.flash_attn_func(qkv8.q, qkv8.k, qkv8.v, block_scales=qkv8.q_scale[0, 0, :2].tolist())
    with pytest.raises(ValueError, match="k_descale: is on meta but q is on cpu"):
        fa3.flash_attn_func(qkv8.q, qkv8.k, qkv8.v, k_descale=torch.ones(1, 2, device="meta"))
    with pytest.raises(ValueError, match="q_block_scale: given, but q's dtype is bf16"):
        fa3.flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16(), block_scales=qkv8.block_scales, block_rows=32)
    with pytest.raises(ValueError, match="input: head dim 72 is not a multiple of 32"):
        fa3.fp8.quantize(q[..., :72], k[..., :72], v[..., :72])


def test_fake_shapes_under_fp8():
    with torch._subclasses.fake_tensor.FakeTensorMode():
        q = torch.empty(2, 100, 8, 128, dtype=E4M3)
        k = torch.empty(2, 70, 2, 128, dtype=E4M3)
        out = fa3.flash_attn_func(q, k, k, q_descale=torch.empty(2, 2))
        assert out.shape == (2, 100, 8, 128) and out.dtype == torch.bfloat16


GPU_SKIP = gpu_skip_reason()


NO_GPU_FP8 = GPU_SKIP is None and not fa3.build_info()["gpu_fp8"]


@pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))
@pytest.mark.skipif(not NO_GPU_FP8, reason="the FP8 kernels are built (FA3_GPU_FP8)")
def test_gpu_refuses_fp8_attention():
    q, k, v = (t.cuda() for t in inputs(seqlen_q=128, seqlen_k=128))
    qkv8 = fa3.fp8.quantize(q, k, v)
    with pytest.raises(NotImplementedError, match=r"e4m3 \(FP8\) is not supported on the GPU yet"):
        fa3.flash_attn_func(qkv8.q, qkv8.k, qkv8.v, block_scales=qkv8.block_scales)


@pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))
@pytest.mark.skipif(NO_GPU_FP8, reason="the FP8 kernels are not built (FA3_GPU_FP8)")
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_fp8_attention_meets_the_accuracy_rule(causal):
    """The FP8 kernel (head dim 128, 128-row block scales) on CUDA tensors: the FP8 rule
    against the exact attention of the dequantized inputs, as on the CPU path."""
    q, k, v = inputs(batch=2, seqlen_q=300, seqlen_k=1000)
    qkv8 = fa3.fp8.quantize(q, k, v, seed=3)
    out, lse = fa3.flash_attn_func(
        *(t.cuda() for t in qkv8[:3]),
        causal=causal,
        block_scales=tuple(s.cuda() for s in qkv8.block_scales),
        return_attn_probs=True,
    )
    assert out.is_cuda and out.dtype == torch.bfloat16 and out.shape == (2, 300, 4, 128)
    ref_out, ref_lse = fp8_reference(qkv8, causal=causal)
    assert relative_error(out.cpu(), ref_out) < 4e-2
    assert_lse_within(lse.cpu(), ref_lse, gpu_lse_bound(qkv8, ref_lse.double()))


@pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))
@pytest.mark.skipif(NO_GPU_FP8, reason="the FP8 kernels are not built (FA3_GPU_FP8)")
def test_gpu_fp8_takes_its_workspace_from_torch(monkeypatch):
    """fa3::fwd_fp8 hands the extension a uint8 tensor on the inputs' device (V
    transposed goes there), of the size the size query gives, 256-byte aligned; or
    none, where the FP8 kernels transpose V in shared memory."""
    from fa3 import _C, _torch_ops

    calls = []
    handoff = _torch_ops.call

    # Recorded before the handoff turns the tensors into DLPack capsules.
    def recording(fn, *args, **kwargs):
        if fn is _C.forward:
            calls.append((args, kwargs))
        return handoff(fn, *args, **kwargs)

    monkeypatch.setattr(_torch_ops, "call", recording)
    q, k, v = inputs(seqlen_q=130, seqlen_k=333)
    qkv8 = fa3.fp8.quantize(q, k, v)
    fa3.flash_attn_func(*(t.cuda() for t in qkv8[:3]), block_scales=tuple(s.cuda() for s in qkv8.block_scales))
    assert len(calls) == 1
    args, kwargs = calls[0]
    workspace = kwargs.pop("workspace")
    kwargs.pop("stream")
    needed = _C.forward_workspace_size(*args, **kwargs)
    if fa3.build_info()["gpu_fp8_vt_smem"]:
        # The FP8 kernels transpose V in shared memory (FA3_FP8_VT_SMEM): no workspace.
        assert workspace is None and needed == 0
        return
    assert workspace.dtype == torch.uint8 and workspace.dim() == 1 and workspace.device == args[0].device
    assert workspace.numel() == needed > 0
    assert workspace.data_ptr() % 256 == 0


@pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_gpu_quantize_matches_cpu_bitwise(dtype, head_dim):
    q, k, v = (t.to(dtype) for t in inputs(batch=2, seqlen_q=1000, seqlen_k=777, head_dim=head_dim))
    cpu = fa3.fp8.quantize(q, k, v, seed=9)
    gpu = fa3.fp8.quantize(q.cuda(), k.cuda(), v.cuda(), seed=9)
    for a, b in zip(cpu[:3], gpu[:3]):
        assert torch.equal(a.view(torch.uint8), b.cpu().view(torch.uint8))
    for a, b in zip(cpu[3:6], gpu[3:6]):
        assert torch.equal(a, b.cpu())


def packed_fp8(q_lens=(70, 0, 130, 1), k_lens=(90, 5, 200, 0), heads=(4, 2), head_dim=64, block=64, seed=0):
    """A varlen batch of e4m3 sequences, each quantized on its own by fa3.fp8.quantize
    (block scales from its first row): the packed codes, the offsets, the block scales
    padded with ones to the longest sequence's blocks, and each sequence's own
    Quantized (None for an empty one)."""
    g = torch.Generator().manual_seed(seed)
    parts, codes = [], ([], [], [])
    nblocks_q = -(-max(q_lens) // block)
    nblocks_k = -(-max(k_lens) // block)
    scales = (
        torch.ones(len(q_lens), heads[0], nblocks_q),
        torch.ones(len(q_lens), heads[1], nblocks_k),
        torch.ones(len(q_lens), heads[1], nblocks_k),
    )
    for b, (sq, sk) in enumerate(zip(q_lens, k_lens)):
        q = torch.randn(1, max(sq, 1), heads[0], head_dim, generator=g)
        k = torch.randn(1, max(sk, 1), heads[1], head_dim, generator=g)
        v = torch.randn(1, max(sk, 1), heads[1], head_dim, generator=g)
        part = fa3.fp8.quantize(q, k, v, block=block, seed=b)
        parts.append(part if sq and sk else None)
        for i, (c, n) in enumerate(zip(part[:3], (sq, sk, sk))):
            codes[i].append(c[0, :n])
            scales[i][b, :, : part.block_scales[i].shape[2]] = part.block_scales[i][0]
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32)
    return tuple(torch.cat(c) for c in codes), cu_q, cu_k, scales, parts


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_func_runs_fp8_per_sequence(causal):
    """Each sequence of an e4m3 varlen batch gives exactly what flash_attn_func gives it
    alone with its own block scales; a sequence without keys gives 0 and lse -inf."""
    (q, k, v), cu_q, cu_k, scales, parts = packed_fp8()
    out, lse = fa3.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 130, 200, causal=causal, block_scales=scales, block_rows=64, return_attn_probs=True
    )
    assert out.dtype == torch.bfloat16 and out.shape == (q.shape[0], 4, 64) and lse.shape == (4, q.shape[0])
    for b, part in enumerate(parts):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        if part is None:
            assert torch.equal(out[rows], torch.zeros_like(out[rows]))
            assert (lse[:, rows] == float("-inf")).all()
            continue
        want, want_lse = fa3.flash_attn_func(
            *part[:3], causal=causal, block_scales=part.block_scales, block_rows=64, return_attn_probs=True
        )
        assert torch.equal(out[rows], want[0])
        assert torch.equal(lse[:, rows], want_lse[0])


@pytest.mark.parametrize("hadamard", [False, True])
def test_quantize_varlen_quantizes_each_sequence_alone(hadamard):
    """fa3.fp8.quantize on a packed batch: each sequence's codes and scales are those of
    quantize on it alone (bitwise), its blocks past its rows scale 1, rows of no
    sequence zero; flash_attn_varlen_func takes the scales as its block_scales."""
    q_lens, k_lens = [70, 0, 130, 1], [90, 5, 200, 0]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(q_lens) + 2, 4, 64, generator=g)
    k = torch.randn(sum(k_lens) + 2, 2, 64, generator=g)
    v = torch.randn(sum(k_lens) + 2, 2, 64, generator=g)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32)
    qkv8 = fa3.fp8.quantize(q, k, v, block=64, hadamard=hadamard, seed=5, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                            max_seqlen_q=130, max_seqlen_k=200)
    assert qkv8.q_scale.shape == (4, 4, 3) and qkv8.k_scale.shape == (4, 2, 4)
    for b in range(4):
        for packed, scale, x, cu, i in ((qkv8.q, qkv8.q_scale, q, cu_q, 0), (qkv8.k, qkv8.k_scale, k, cu_k, 1),
                                        (qkv8.v, qkv8.v_scale, v, cu_k, 2)):
            rows = slice(int(cu[b]), int(cu[b + 1]))
            n = rows.stop - rows.start
            if n == 0:
                assert (scale[b] == 1).all()
                continue
            codes, alone = fa3.fp8.quantize_tensor(x[None, rows], 64, hadamard and i < 2, 5)
            assert torch.equal(packed[rows].view(torch.uint8), codes[0].view(torch.uint8))
            assert torch.equal(scale[b, :, : alone.shape[2]], alone[0])
            assert (scale[b, :, alone.shape[2] :] == 1).all()
    assert (qkv8.q[-2:].view(torch.uint8) == 0).all(), "rows of no sequence are zero"
    out = fa3.flash_attn_varlen_func(qkv8.q, qkv8.k, qkv8.v, cu_q, cu_k, 130, 200, block_scales=qkv8.block_scales,
                                     block_rows=64)
    alone = fa3.flash_attn_func(qkv8.q[None, 70:200], qkv8.k[None, 95:295], qkv8.v[None, 95:295],
                                block_scales=tuple(s[2:3, :, : -(-n // 64)] for s, n in zip(qkv8.block_scales,
                                                                                           (130, 200, 200))),
                                block_rows=64)
    assert torch.equal(out[70:200], alone[0])


def test_flash_attn_varlen_func_takes_descales_per_sequence():
    """Descales are (batch, nheads_k): sequence b reads row b. A power of two on one
    sequence's v_descale scales its rows of out exactly and leaves the others alone."""
    (q, k, v), cu_q, cu_k, _, _ = packed_fp8()
    descales = [torch.rand(4, 2, generator=torch.Generator().manual_seed(i)) + 0.5 for i in range(3)]
    out = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 130, 200, q_descale=descales[0], k_descale=descales[1],
                                     v_descale=descales[2])
    doubled = descales[2].clone()
    doubled[2] *= 2
    again = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 130, 200, q_descale=descales[0], k_descale=descales[1],
                                       v_descale=doubled)
    third = slice(int(cu_q[2]), int(cu_q[3]))
    assert torch.equal(again[third], 2 * out[third])
    rest = torch.ones(q.shape[0], dtype=torch.bool)
    rest[third] = False
    assert torch.equal(again[rest], out[rest])
    with pytest.raises(ValueError, match=r"q_descale: shape \(3, 2\) must be \(batch, nheads_kv\) = \(4, 2\)"):
        fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 130, 200, q_descale=descales[0][:3])


def test_fake_shapes_under_fp8_varlen():
    with torch._subclasses.fake_tensor.FakeTensorMode():
        q = torch.empty(300, 8, 128, dtype=E4M3)
        k = torch.empty(500, 2, 128, dtype=E4M3)
        cu = torch.empty(4, dtype=torch.int32)
        out, lse = fa3.flash_attn_varlen_func(q, k, k, cu, cu, 200, 300, q_descale=torch.empty(3, 2),
                                              return_attn_probs=True)
        assert out.shape == (300, 8, 128) and out.dtype == torch.bfloat16 and lse.shape == (8, 300)


NO_GPU_FP8_VARLEN = GPU_SKIP is None and not fa3.build_info()["gpu_fp8_varlen"]


@pytest.mark.skipif(not NO_GPU_FP8_VARLEN, reason="varlen e4m3 calls run on the GPU (FA3_GPU_FP8_VARLEN)")
@pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))
def test_gpu_refuses_fp8_varlen_by_its_option():
    (q, k, v), cu_q, cu_k, scales, _ = packed_fp8(block=128)
    with pytest.raises(NotImplementedError, match="FA3_GPU_FP8_VARLEN"):
        fa3.flash_attn_varlen_func(*(t.cuda() for t in (q, k, v, cu_q, cu_k)), 130, 200,
                                   block_scales=tuple(s.cuda() for s in scales))


@pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))
@pytest.mark.skipif(NO_GPU_FP8_VARLEN, reason="varlen e4m3 calls are off on the GPU (FA3_GPU_FP8_VARLEN)")
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_fp8_varlen_meets_the_accuracy_rule(causal):
    """CUDA tensors against the CPU path on the same codes and 128-row block scales, per
    sequence by the FP8 rule (TESTING.md), each sequence's exact attention of its
    dequantized values as the reference; rows of no sequence 0 and -inf."""
    (q, k, v), cu_q, cu_k, scales, parts = packed_fp8(q_lens=(300, 0, 129, 7), k_lens=(1000, 5, 128, 0), block=128)
    out, lse = fa3.flash_attn_varlen_func(
        *(t.cuda() for t in (q, k, v, cu_q, cu_k)), 300, 1000, causal=causal,
        block_scales=tuple(s.cuda() for s in scales), return_attn_probs=True
    )
    out, lse = out.cpu(), lse.cpu()
    for b, part in enumerate(parts):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        if part is None:
            assert torch.equal(out[rows], torch.zeros_like(out[rows]))
            assert (lse[:, rows] == float("-inf")).all()
            continue
        ref_out, ref_lse = fp8_reference(part, causal=causal)
        assert relative_error(out[rows][None], ref_out) < 4e-2
        assert_lse_within(lse[:, rows][None], ref_lse, gpu_lse_bound(part, ref_lse.double()))


def test_opcheck_fp8_ops():
    """torch.library.opcheck on the FP8 ops: fake implementation, autograd registration,
    AOT dispatch. Not its schema test, whose check for mutated inputs multiplies them,
    which torch does not implement for float8_e4m3fn."""
    (q, k, v), cu_q, cu_k, scales, parts = packed_fp8(block=128)
    options = (128, 0.125, True, -1, 0, 0.0, 0)
    descales = tuple(torch.rand(4, 2) + 0.5 for _ in range(3))
    checks = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(
        torch.ops.fa3.varlen_fwd_fp8.default,
        (q, k, v, cu_q, cu_k, None, None, 130, 200, None, *descales, *scales, *options),
        test_utils=checks,
    )
    part = parts[0]
    torch.library.opcheck(
        torch.ops.fa3.fwd_fp8.default, (*part[:3], None, None, None, None, *part.block_scales, *options),
        test_utils=checks,
    )


def test_flash_attn_with_kvcache_runs_fp8():
    """e4m3 q, cache and new rows with per-(batch, kv head) descales: each sequence gives
    what flash_attn_func gives on its cached keys and the appended ones, bitwise; the
    appended codes land in the cache unchanged; out is bfloat16."""
    g = torch.Generator().manual_seed(7)
    batch, cap, seqlens, new = 3, 40, [5, 0, 33], 2
    q = torch.randn(batch, 2, 8, 64, generator=g).to(E4M3)
    k_cache = torch.randn(batch, cap, 2, 64, generator=g).to(E4M3)
    v_cache = torch.randn(batch, cap, 2, 64, generator=g).to(E4M3)
    k_new = torch.randn(batch, new, 2, 64, generator=g).to(E4M3)
    v_new = torch.randn(batch, new, 2, 64, generator=g).to(E4M3)
    descales = [torch.rand(batch, 2, generator=g) + 0.5 for _ in range(3)]
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32)
    out, lse = fa3.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=cache_seqlens, causal=True, q_descale=descales[0],
        k_descale=descales[1], v_descale=descales[2], return_softmax_lse=True,
    )
    assert out.dtype == torch.bfloat16 and out.shape == (batch, 2, 8, 64)
    for b, n in enumerate(seqlens):
        assert torch.equal(k_cache[b, n : n + new].view(torch.uint8), k_new[b].view(torch.uint8))
        want, want_lse = fa3.flash_attn_func(
            q[b : b + 1], k_cache[b : b + 1, : n + new], v_cache[b : b + 1, : n + new], causal=True,
            q_descale=descales[0][b : b + 1], k_descale=descales[1][b : b + 1], v_descale=descales[2][b : b + 1],
            return_attn_probs=True,
        )
        assert torch.equal(out[b : b + 1], want)
        assert torch.equal(lse[b : b + 1], want_lse)
    with pytest.raises(ValueError, match="rotary_cos: a rotary embedding of e4m3 inputs is not supported"):
        cos = torch.ones(64, 16).to(E4M3)
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=cos,
                                    cache_seqlens=cache_seqlens)


@pytest.mark.skipif(GPU_SKIP is None and not fa3.build_info()["gpu_kvcache"], reason="no GPU KV-cache path")
@pytest.mark.skipif(GPU_SKIP is None and fa3.build_info()["gpu_fp8_kvcache"], reason="FA3_GPU_FP8_KVCACHE is on")
@pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))
def test_gpu_refuses_fp8_kvcache():
    q = torch.randn(1, 1, 8, 128, device="cuda").to(E4M3)
    cache = torch.randn(1, 64, 2, 128, device="cuda").to(E4M3)
    with pytest.raises(NotImplementedError, match=r"q: e4m3 \(FP8\) KV-cache calls are not supported on the GPU"):
        fa3.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=10)


def test_flash_attn_func_takes_an_e4m3_v_with_its_keys_contiguous():
    """FlashAttention-3's V_colmajor: an e4m3 v whose seqlen dimension has stride 1 gives
    the row-major v's result bitwise; a bf16 v so laid out is refused by name."""
    q, k, v = inputs(seqlen_q=70, seqlen_k=150, outliers=False)
    q8, k8, v8 = (t.to(E4M3) for t in (q, k, v))
    v_cols = v8.view(torch.uint8).permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2).view(E4M3)
    assert v_cols.stride(1) == 1 and torch.equal(v_cols.view(torch.uint8), v8.view(torch.uint8))
    want = fa3.flash_attn_func(q8, k8, v8, causal=True)
    assert torch.equal(fa3.flash_attn_func(q8, k8, v_cols, causal=True), want)
    bf16_cols = v.bfloat16().permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    with pytest.raises(ValueError, match="v: the last dimension"):
        fa3.flash_attn_func(q.bfloat16(), k.bfloat16(), bf16_cols)
