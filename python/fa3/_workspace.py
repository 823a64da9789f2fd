"""Scratch memory of GPU calls, from torch's allocator, sized once per call signature.

Asking the extension for a workspace size converts and validates every argument, which
costs as much host time as a small call's kernels take (about 25 us for a decode step
on the H200 machine). The size follows from shapes, dtypes, options and the device
alone, never from the data or the strides, so each call signature asks once; the call
itself still validates every argument.
"""

import torch

from ._handoff import call

# Sizes by signature, emptied when full: a training loop or a decode step repeats a
# few signatures call after call, and a process that goes through more only asks again.
_sizes = {}
_LIMIT = 1024


def _signature(x):
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype)
    return x


def cached_workspace(size_fn, device, *args, **kwargs):
    """A uint8 tensor of size_fn(*args, **kwargs) bytes on `device` (a CUDA device),
    or None when that is 0. Fresh blocks of torch's CUDA caching allocator are 256-byte
    aligned, as the kernels need (see _torch_ops._backward_workspace)."""
    key = (size_fn, device.index, *map(_signature, args), *((k, _signature(v)) for k, v in kwargs.items()))
    nbytes = _sizes.get(key)
    if nbytes is None:
        nbytes = call(size_fn, *args, **kwargs)
        if len(_sizes) >= _LIMIT:
            _sizes.clear()
        _sizes[key] = nbytes
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes > 0 else None
