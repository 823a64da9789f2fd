"""fa3: exact, IO-aware attention for NVIDIA Hopper GPUs (the FlashAttention-3 algorithm).

With PyTorch installed, fa3 offers FlashAttention-3's Python interface
(flash_attn_func and friends, see fa3.interface), so that
``import fa3 as flash_attn_interface`` stands in for it. build_info() and
device_info() need no PyTorch; neither does the extension fa3._C, which takes any
DLPack tensor. fa3.tune() times the forward kernels on a problem and keeps the fastest
in a tuning cache, which the forward pass uses when autotuning is on (FA3_AUTOTUNE=1 or
fa3.set_autotune(True)).
"""

import importlib.util

_HAS_TORCH = importlib.util.find_spec("torch") is not None
if _HAS_TORCH:
    # Load torch's CUDA libraries before the extension's, so that one CUDA runtime
    # (torch's) serves both.
    import torch  # noqa: F401

from ._info import build_info, device_info
from .tune import autotune_enabled, set_autotune, tune, tune_cache_entries, tune_cache_path

__version__ = build_info()["version"]

__all__ = [
    "build_info",
    "device_info",
    "tune",
    "set_autotune",
    "autotune_enabled",
    "tune_cache_path",
    "tune_cache_entries",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "get_scheduler_metadata",
    "merge_attention_states",
    "merge_attention_states_list",
]
_TORCH_API = __all__[7:]

if _HAS_TORCH:
    from .interface import (
        flash_attn_combine,
        flash_attn_func,
        flash_attn_qkvpacked_func,
        flash_attn_varlen_func,
        flash_attn_with_kvcache,
        get_scheduler_metadata,
    )
    from ._merge import merge_attention_states, merge_attention_states_list
    from . import fp8  # noqa: F401  (fa3.fp8.quantize)
else:

    def __getattr__(name):
        if name in _TORCH_API:
            raise ImportError(f"fa3.{name} needs PyTorch (pip install torch); fa3._C takes DLPack tensors without it")
        raise AttributeError(f"module 'fa3' has no attribute {name!r}")
