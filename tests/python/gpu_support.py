"""Whether this machine can run fa3's GPU kernels, for the tests that need them."""

import torch

import fa3

_BUILD = fa3.build_info()
_DTYPE_NAMES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BUILT_DTYPES = [_DTYPE_NAMES[name] for name in _BUILD["dtypes"]]
BUILT_HEAD_DIMS = _BUILD["head_dims"]


def capture(fn, after_warmup=None):
    """fn() captured into a CUDA graph after one warm-up call on a side stream, as PyTorch
    asks before a capture (`after_warmup()`, when given, runs between them). Returns the
    graph and what the captured call returned: the tensors every replay writes."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    if after_warmup is not None:
        after_warmup()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def hopper_skip_reason():
    """None when CUDA tensors can run the kernels every build holds (the merge of
    attention states, the split-KV combine), else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"{torch.cuda.get_device_name()} is not a Hopper GPU (compute capability 9.0)"
    return None


def gpu_skip_reason():
    """None when CUDA tensors can run fa3's attention kernels here, else why not."""
    if hopper_skip_reason() is not None:
        return hopper_skip_reason()
    if not _BUILD["gpu_kernels"]:
        return "fa3 was built without GPU kernels"
    return None
