"""python/fa3/_handoff.py: torch tensors reach the extension as DLPack capsules made by
torch.utils.dlpack.to_dlpack (no stream touched, no Python-level __dlpack__), anything
else as it is, lists and tuples element by element. CPU tensors take the road CUDA
ones do, so it is checked here without a GPU."""

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

# Loaded from its file: the module needs nothing of the built package.
_spec = importlib.util.spec_from_file_location(
    "fa3_handoff_under_test", Path(__file__).resolve().parents[2] / "python" / "fa3" / "_handoff.py"
)
_handoff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_handoff)


def is_capsule(x):
    return type(x).__name__ == "PyCapsule"


def received(*args, **kwargs):
    seen = {}
    _handoff.call(lambda *a, **k: seen.update(args=a, kwargs=k), *args, **kwargs)
    return seen["args"], seen["kwargs"]


def test_tensors_go_over_as_capsules_of_the_same_memory():
    t = torch.arange(24, dtype=torch.bfloat16).reshape(2, 3, 4)[:, 1:, :]
    u = torch.zeros(5, dtype=torch.int32)
    args, kwargs = received(t, [u, 3], out=t, flag=True)
    assert is_capsule(args[0]) and is_capsule(args[1][0]) and is_capsule(kwargs["out"])
    back = torch.from_dlpack(args[0])
    assert back.data_ptr() == t.data_ptr()
    assert back.shape == t.shape and back.stride() == t.stride() and back.dtype == t.dtype
    assert torch.from_dlpack(args[1][0]).data_ptr() == u.data_ptr()
    assert args[1][1] == 3 and isinstance(args[1], list) and kwargs["flag"] is True


class NoDunderExport(torch.Tensor):
    def __dlpack__(self, *args, **kwargs):
        raise AssertionError("the handoff must not go through __dlpack__ (its stream handling)")


def test_the_export_does_not_go_through_dunder_dlpack():
    t = torch.ones(4).as_subclass(NoDunderExport)
    args, _ = received(t)
    assert is_capsule(args[0])
    assert torch.equal(torch.from_dlpack(args[0]), torch.ones(4))


def test_tensors_that_require_grad_go_over_too():
    t = torch.ones(3, requires_grad=True)
    args, _ = received(t)
    assert torch.from_dlpack(args[0]).data_ptr() == t.data_ptr()


def test_other_values_go_over_unchanged():
    marker = object()
    args, kwargs = received(None, 1.5, "x", (None, 2), marker, stream=0)
    assert args == (None, 1.5, "x", (None, 2), marker)
    assert isinstance(args[3], tuple) and args[4] is marker
    assert kwargs == {"stream": 0}
