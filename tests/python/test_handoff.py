"""python/fa3/_handoff.py: CUDA tensors reach the extension as DLPack capsules made by
torch.utils.dlpack.to_dlpack (no stream touched, no Python-level __dlpack__), anything
else as it is, lists and tuples element by element. Runs without a GPU: a stand-in plays
the CUDA tensor."""

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


class StandInCudaTensor:
    is_cuda = True

    def __init__(self):
        self.dlpack_calls = 0

    def __dlpack__(self, **kwargs):
        self.dlpack_calls += 1
        raise AssertionError("the handoff must not go through __dlpack__")


def test_cuda_tensors_go_over_as_to_dlpack_capsules(monkeypatch):
    exported = []
    monkeypatch.setattr(_handoff, "_to_dlpack", lambda t: exported.append(t) or ("capsule", id(t)))
    a, b = StandInCudaTensor(), StandInCudaTensor()
    seen = {}
    _handoff.call(lambda *args, **kwargs: seen.update(args=args, kwargs=kwargs), a, [b, 3], flag=True, t=a)
    assert seen["args"] == (("capsule", id(a)), [("capsule", id(b)), 3])
    assert seen["kwargs"] == {"flag": True, "t": ("capsule", id(a))}
    assert sorted(map(id, exported)) == sorted([id(a), id(b), id(a)])
    assert a.dlpack_calls == 0 and b.dlpack_calls == 0


def test_cpu_tensors_and_other_values_go_over_unchanged():
    t = torch.arange(6.0).reshape(2, 3)
    seen = []
    _handoff.call(lambda *args: seen.extend(args), t, (t, None), "x", 1.5)
    assert seen[0] is t
    assert seen[1][0] is t and seen[1][1] is None and isinstance(seen[1], tuple)
    assert seen[2:] == ["x", 1.5]


def test_to_dlpack_capsules_share_the_tensor_memory():
    # What the CUDA path relies on, checked where it can run: the capsule views the
    # same memory with the same shape, strides and dtype.
    from torch.utils.dlpack import to_dlpack

    t = torch.arange(24, dtype=torch.bfloat16).reshape(2, 3, 4)[:, 1:, :]
    back = torch.from_dlpack(to_dlpack(t))
    assert back.data_ptr() == t.data_ptr()
    assert back.shape == t.shape and back.stride() == t.stride() and back.dtype == t.dtype
