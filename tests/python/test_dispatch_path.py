"""flash_attn_func's two ways to the extension: straight to it for eager calls on plain
tensors that need no autograd, and through the fa3::fwd custom op for everything that
relies on the op (autograd, torch.compile, torch modes, tensor subclasses, the
profiler). Both give identical results, and whatever watches for the op still sees it.

CPU tensors, so it runs anywhere with PyTorch.
"""

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from fa3 import _torch_ops  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


def make_qkv(requires_grad=False):
    gen = torch.Generator().manual_seed(5)
    shapes = [(2, 19, 4, 64), (2, 23, 2, 64), (2, 23, 2, 64)]
    return [torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_(requires_grad) for s in shapes]


def through_op(q, k, v):
    """The op's result for flash_attn_func(q, k, v, causal=True)."""
    return torch.ops.fa3.fwd(q.detach(), k.detach(), v.detach(), None, 0.0, True, -1, 0, 0.0, False)[0]


@pytest.fixture
def op_calls(monkeypatch):
    """The calls flash_attn_func makes through the custom op."""
    calls = []
    op = _torch_ops.attention_forward

    def counted(*args):
        calls.append(args)
        return op(*args)

    monkeypatch.setattr(_torch_ops, "attention_forward", counted)
    return calls


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


def test_autograd_takes_the_op(op_calls):
    q, k, v = make_qkv(requires_grad=True)
    out = fa3.flash_attn_func(q, k, v, causal=True)
    assert len(op_calls) == 1
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (q, k, v))
    assert torch.equal(out.detach(), through_op(q, k, v))


def test_sinks_take_the_op_when_they_require_grad(op_calls):
    q, k, v = make_qkv()
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(6))
    out = fa3.flash_attn_func(q, k, v, causal=True, sinks=sinks)
    assert op_calls == []
    sinks.requires_grad_()
    assert torch.equal(fa3.flash_attn_func(q, k, v, causal=True, sinks=sinks), out)
    assert len(op_calls) == 1
    assert torch.equal(out, torch.ops.fa3.fwd(q, k, v, sinks.detach(), 0.0, True, -1, 0, 0.0, False)[0])


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
