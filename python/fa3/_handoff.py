"""Handing torch tensors to the extension without a stream synchronization.

The extension reads tensors through DLPack. Converting a CUDA tensor, it would call
the tensor's __dlpack__() without a stream, and torch then makes its default stream
wait for the current one whenever the two differ: an event and a wait on every call
made from a side stream, and, inside a CUDA graph capture (which runs on a side
stream), a dependency of the legacy default stream on the capturing stream, which
CUDA refuses (cudaErrorStreamCaptureImplicit). The extension enqueues its work on the
caller's current stream itself, so no synchronization is wanted: torch tensors go over
as capsules made by torch.utils.dlpack.to_dlpack, which exports without touching any
stream. It is also the cheap export: __dlpack__ reaches the same capsule through a
Python method that checks its arguments and streams first, 2.8 us a tensor against
0.4 (CPU tensors, torch 2.15), which a decode step of 7 tensors pays on every call.
CPU tensors take the same road (one path for both devices, and the extension's own
__dlpack__ call on a CPU tensor cost as much). torch is not imported here: fa3 imports
without it, and a torch tensor can only come from a process that has imported it.
"""

import sys

# Argument types that go over as they are, let through by one set lookup: most of a
# call's arguments are options and absent tensors (a decode step's handoff of 25
# arguments took 11 us of host time without it, 7.5 with it; CPU, Python 3.11).
_AS_IS = frozenset((type(None), bool, int, float, str))
_torch = None  # (torch.Tensor, torch.utils.dlpack.to_dlpack), once torch is loaded


def _torch_export():
    global _torch
    if _torch is None and "torch" in sys.modules:
        import torch.utils.dlpack

        _torch = (torch.Tensor, torch.utils.dlpack.to_dlpack)
    return _torch


def _export(x):
    cls = type(x)
    if cls in _AS_IS:
        return x
    if cls is list or cls is tuple:
        return cls(_export(e) for e in x)
    exporter = _torch or _torch_export()
    if exporter is not None and isinstance(x, exporter[0]):
        return exporter[1](x)
    return x


def call(fn, *args, **kwargs):
    """fn(*args, **kwargs) with every torch tensor among the arguments (lists included)
    handed over as a DLPack capsule, without a stream synchronization. Plain values are
    let through before any function call (_export's first test, inlined)."""
    return fn(
        *[a if type(a) in _AS_IS else _export(a) for a in args],
        **{k: v if type(v) in _AS_IS else _export(v) for k, v in kwargs.items()},
    )
