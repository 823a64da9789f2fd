"""Handing torch tensors to the extension without a stream synchronization.

The extension reads tensors through DLPack. Converting a CUDA tensor, it would call
the tensor's __dlpack__() without a stream, and torch then makes its default stream
wait for the current one whenever the two differ: an event and a wait on every call
made from a side stream, and, inside a CUDA graph capture (which runs on a side
stream), a dependency of the legacy default stream on the capturing stream, which
CUDA refuses (cudaErrorStreamCaptureImplicit). The extension enqueues its work on the
caller's current stream itself, so no synchronization is wanted: CUDA tensors go over
as capsules exported with stream=-1, DLPack's "no synchronization". (torch is not
imported here: fa3 imports without it.)
"""


def _export(x):
    if getattr(x, "is_cuda", False) and hasattr(x, "__dlpack__"):
        return x.__dlpack__(stream=-1)
    if isinstance(x, (list, tuple)):
        return type(x)(_export(e) for e in x)
    return x


def call(fn, *args, **kwargs):
    """fn(*args, **kwargs) with every CUDA tensor among the arguments (lists included)
    handed over without a stream synchronization."""
    return fn(*(_export(a) for a in args), **{k: _export(v) for k, v in kwargs.items()})
