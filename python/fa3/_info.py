"""What this build of fa3 holds, and what GPU it sees. Needs no PyTorch."""

from . import _C


def build_info():
    """Returns a dict: version, cuda_version, cutlass_version, head_dims and dtypes
    with compiled GPU kernels, gpu_kernels (False when none were built)."""
    return _C.build_info()


def device_info(device=None):
    """Returns a dict describing a CUDA device: present, index, name,
    compute_capability, sm_count, global_memory_bytes, l2_bytes,
    max_smem_per_block_optin, is_hopper, and error (why present is False).

    `device` is None (the current device), an index, "cuda" / "cuda:N", or any
    object with an `index` attribute such as torch.device. Never raises for a
    machine without a GPU: present is then False.
    """
    return _C.device_info(_device_index(device))


def _device_index(device):
    if device is None:
        return -1
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device: index must be >= 0, got {device}")
        return device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda" or (index and not index.isdigit()):
            raise ValueError(f"device: expected 'cuda' or 'cuda:N', got {device!r}")
        return int(index) if index else -1
    index = getattr(device, "index", None)
    if getattr(device, "type", "cuda") != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device}")
    return -1 if index is None else int(index)
