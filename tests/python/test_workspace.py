"""The workspace-size cache (_workspace.cached_workspace): the extension is asked once
per call signature (shapes, dtypes, options, device), and again when any of them
changes; the data and the strides are not part of it.

CPU tensors and a stand-in size function, so it runs anywhere with PyTorch.
"""

import pytest

torch = pytest.importorskip("torch")

from fa3 import _workspace  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(_workspace, "_sizes", {})


def size_function(nbytes=1024):
    asked = []

    def kvcache_workspace_size(*args, **kwargs):
        asked.append((args, kwargs))
        return nbytes

    return kvcache_workspace_size, asked


def test_one_question_per_signature():
    size_fn, asked = size_function()
    q, k = torch.zeros(2, 8, 4, 64), torch.zeros(2, 16, 4, 64)
    first = _workspace.cached_workspace(size_fn, CPU, q, k, causal=True, sinks=None)
    assert first.dtype == torch.uint8 and first.numel() == 1024
    # Other data and other strides, the same signature.
    q2 = torch.randn(2, 4, 8, 64).transpose(1, 2)
    again = _workspace.cached_workspace(size_fn, CPU, q2, torch.ones(2, 16, 4, 64), causal=True, sinks=None)
    assert again.numel() == 1024
    assert len(asked) == 1
    # A fresh tensor each call: the caller may still be using the previous one.
    assert again.data_ptr() != first.data_ptr()


@pytest.mark.parametrize(
    "change",
    [
        lambda q, k, kw: ((torch.zeros(2, 9, 4, 64), k), kw),
        lambda q, k, kw: ((q.to(torch.bfloat16), k), kw),
        lambda q, k, kw: ((q, k), {**kw, "causal": False}),
        lambda q, k, kw: ((q, k), {**kw, "sinks": torch.zeros(4)}),
    ],
    ids=["shape", "dtype", "option", "optional-tensor"],
)
def test_a_changed_signature_asks_again(change):
    size_fn, asked = size_function()
    q, k, kw = torch.zeros(2, 8, 4, 64), torch.zeros(2, 16, 4, 64), {"causal": True, "sinks": None}
    _workspace.cached_workspace(size_fn, CPU, q, k, **kw)
    args, kw2 = change(q, k, kw)
    _workspace.cached_workspace(size_fn, CPU, *args, **kw2)
    assert len(asked) == 2


def test_size_functions_do_not_share_answers():
    fn_a, asked_a = size_function(256)
    fn_b, asked_b = size_function(512)
    q = torch.zeros(1, 4, 2, 64)
    assert _workspace.cached_workspace(fn_a, CPU, q).numel() == 256
    assert _workspace.cached_workspace(fn_b, CPU, q).numel() == 512
    assert len(asked_a) == len(asked_b) == 1


def test_zero_bytes_is_no_workspace():
    size_fn, asked = size_function(0)
    assert _workspace.cached_workspace(size_fn, CPU, torch.zeros(1, 4, 2, 64)) is None
    assert _workspace.cached_workspace(size_fn, CPU, torch.zeros(1, 4, 2, 64)) is None
    assert len(asked) == 1


def test_a_full_cache_starts_over(monkeypatch):
    monkeypatch.setattr(_workspace, "_LIMIT", 3)
    size_fn, asked = size_function()
    for n in range(5):
        _workspace.cached_workspace(size_fn, CPU, torch.zeros(n + 1, 4))
    assert len(_workspace._sizes) <= 3
    _workspace.cached_workspace(size_fn, CPU, torch.zeros(5, 4))
    assert len(asked) == 5
