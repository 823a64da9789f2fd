"""flash_attn_func's ways to the extension: straight to it for eager calls on plain
tensors that need no autograd, by an autograd.Function for eager calls that need
autograd alone, and through the fa3::fwd custom op for everything else that relies on
the op (torch.compile, torch modes, tensor subclasses, the profiler). All give
identical results and gradients, and whatever watches for the op still sees it.

CPU tensors, so it runs anywhere with PyTorch.
"""

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from fa3 import _torch_ops, _torch_varlen_ops  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


def make_qkv(requires_grad=False):
    gen = torch.Generator().manual_seed(5)
    shapes = [(2, 19, 4, 64), (2, 23, 2, 64), (2, 23, 2, 64)]
    return [torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_(requires_grad) for s in shapes]


def through_op(q, k, v):
    """The op's result for flash_attn_func(q, k, v, causal=True)."""
    return torch.ops.fa3.fwd(q.detach(), k.detach(), v.detach(), None, 0.0, True, -1, 0, 0.0, False)[0]


def count_calls(monkeypatch, module, name):
    """The calls made through module.name (a custom op) from now on."""
    calls = []
    op = getattr(module, name)

    def counted(*args):
        calls.append(args)
        return op(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture
def op_calls(monkeypatch):
    """The calls flash_attn_func makes through the custom op."""
    return count_calls(monkeypatch, _torch_ops, "attention_forward")


class OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_plain_eager_call_skips_the_op(op_calls):
    q, k, v = make_qkv()
    out = fa3.flash_attn_func(q, k, v, causal=True)
    assert op_calls == []
    assert torch.equal(out, through_op(q, k, v))


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_inputs_requiring_grad_without_autograd_skip_the_op(op_calls, context):
    q, k, v = make_qkv(requires_grad=True)
    with context():
        out, lse = fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert op_calls == []
    assert not out.requires_grad and lse.dtype == torch.float32
    assert torch.equal(out, through_op(q, k, v))


def op_gradients(q, k, v, dout, sinks=None):
    """flash_attn_func(q, k, v, causal=True, sinks=sinks)'s output and gradients
    through the op and its autograd formula."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if sinks is not None:
        leaves.append(sinks.detach().clone().requires_grad_())
    out = torch.ops.fa3.fwd(*leaves[:3], leaves[3] if sinks is not None else None, 0.0, True, -1, 0, 0.0, False)[0]
    return out, torch.autograd.grad(out, leaves, dout)


def test_autograd_skips_the_op_with_the_same_gradients(op_calls):
    q, k, v = make_qkv(requires_grad=True)
    out = fa3.flash_attn_func(q, k, v, causal=True)
    assert op_calls == []
    assert out.requires_grad
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    out_op, grads_op = op_gradients(q, k, v, dout)
    assert torch.equal(out.detach(), out_op.detach())
    for got, want, t in zip(grads, grads_op, (q, k, v)):
        assert got.shape == t.shape and torch.equal(got, want)


def test_sinks_requiring_grad_get_the_same_gradient_without_the_op(op_calls):
    q, k, v = make_qkv()
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(6))
    out = fa3.flash_attn_func(q, k, v, causal=True, sinks=sinks)
    sinks.requires_grad_()
    out_grad = fa3.flash_attn_func(q, k, v, causal=True, sinks=sinks)
    assert op_calls == []
    assert torch.equal(out_grad.detach(), out)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(8)).to(out.dtype)
    (dsinks,) = torch.autograd.grad(out_grad, (sinks,), dout)
    _, grads_op = op_gradients(q, k, v, dout, sinks)
    assert torch.equal(dsinks, grads_op[3])


def test_gradient_of_a_noncontiguous_dout(op_calls):
    q, k, v = make_qkv(requires_grad=True)
    out = fa3.flash_attn_func(q, k, v, causal=True)
    dout_t = torch.randn(out.shape[::-1], generator=torch.Generator().manual_seed(9)).to(out.dtype)
    dout = dout_t.permute(3, 2, 1, 0)  # the head dim is not contiguous
    assert dout.stride(-1) != 1
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _, grads_op = op_gradients(q, k, v, dout.contiguous())
    assert all(torch.equal(got, want) for got, want in zip(grads, grads_op))


def test_no_second_derivative_either_way():
    q, k, v = make_qkv(requires_grad=True)
    for out in (fa3.flash_attn_func(q, k, v, causal=True), torch.ops.fa3.fwd(q, k, v, None, 0.0, True, -1, 0, 0.0, False)[0]):
        (dq,) = torch.autograd.grad(out.float().sum(), (q,), create_graph=True)
        with pytest.raises(RuntimeError):
            dq.float().sum().backward()


def test_autograd_under_a_mode_takes_the_op(op_calls):
    q, k, v = make_qkv(requires_grad=True)
    with OpRecorder() as recorder:
        out = fa3.flash_attn_func(q, k, v, causal=True)
        out.float().sum().backward()
    assert len(op_calls) == 1
    assert "fa3.fwd.default" in recorder.ops and "fa3.bwd.default" in recorder.ops


def test_dispatch_mode_sees_the_op(op_calls):
    q, k, v = make_qkv()
    with OpRecorder() as recorder:
        fa3.flash_attn_func(q, k, v, causal=True)
    assert len(op_calls) == 1
    assert "fa3.fwd.default" in recorder.ops


def test_profiler_sees_the_op(op_calls):
    q, k, v = make_qkv()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fa3.flash_attn_func(q, k, v, causal=True)
    assert len(op_calls) == 1
    assert any("fa3::fwd" in event.key for event in prof.key_averages())


def test_compiled_graph_holds_the_op():
    q, k, v = make_qkv()
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(
        lambda q, k, v: fa3.flash_attn_func(q, k, v, causal=True), backend=recording_backend, fullgraph=True
    )
    out = compiled(q, k, v)
    assert any("fa3.fwd" in str(node.target) for gm in graphs for node in gm.graph.nodes)
    assert torch.equal(out, through_op(q, k, v))


# flash_attn_varlen_func takes the same ways (fa3::varlen_fwd and fa3::varlen_bwd).
def make_varlen(requires_grad=False):
    gen = torch.Generator().manual_seed(11)
    cu_q = torch.tensor([0, 7, 19], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 23], dtype=torch.int32)
    shapes = [(19, 4, 64), (23, 2, 64), (23, 2, 64)]
    q, k, v = (torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_(requires_grad) for s in shapes)
    return q, k, v, cu_q, cu_k


def varlen_call(q, k, v, cu_q, cu_k):
    return fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 14, causal=True)


def varlen_through_op(q, k, v, cu_q, cu_k, dout=None):
    leaves = [t.detach().clone().requires_grad_(dout is not None) for t in (q, k, v)]
    out = torch.ops.fa3.varlen_fwd(*leaves, cu_q, cu_k, None, None, 12, 14, None, 0.0, True, -1, 0, 0.0, False, 0)[0]
    return out, (torch.autograd.grad(out, leaves, dout) if dout is not None else None)


@pytest.fixture
def varlen_op_calls(monkeypatch):
    """The calls flash_attn_varlen_func makes through its custom op."""
    return count_calls(monkeypatch, _torch_varlen_ops, "varlen_forward")


def test_varlen_eager_call_skips_the_op(varlen_op_calls):
    q, k, v, cu_q, cu_k = make_varlen()
    out = varlen_call(q, k, v, cu_q, cu_k)
    assert varlen_op_calls == []
    assert torch.equal(out, varlen_through_op(q, k, v, cu_q, cu_k)[0])


def test_varlen_autograd_skips_the_op_with_the_same_gradients(varlen_op_calls):
    q, k, v, cu_q, cu_k = make_varlen(requires_grad=True)
    out = varlen_call(q, k, v, cu_q, cu_k)
    assert varlen_op_calls == []
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(12)).to(out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    out_op, grads_op = varlen_through_op(q, k, v, cu_q, cu_k, dout)
    assert torch.equal(out.detach(), out_op.detach())
    for got, want, t in zip(grads, grads_op, (q, k, v)):
        assert got.shape == t.shape and torch.equal(got, want)


def test_varlen_under_a_mode_takes_the_op(varlen_op_calls):
    q, k, v, cu_q, cu_k = make_varlen(requires_grad=True)
    with OpRecorder() as recorder:
        varlen_call(q, k, v, cu_q, cu_k).float().sum().backward()
    assert len(varlen_op_calls) == 1
    assert "fa3.varlen_fwd.default" in recorder.ops and "fa3.varlen_bwd.default" in recorder.ops
