"""Builds FlashAttention-3's Hopper extension from a checkout of its public source, as the
yardstick that `bench_attention.py --impls flashattention3` times beside fa3 in one
process. Nothing of it enters fa3: the build goes to its own directory.

    python bench/build_flashattention3.py --source PATH/flash-attention \\
        --cutlass CUTLASS_INCLUDE_DIR --out DIR [--head-dims 64 128 256] [--mha-only] [--fp8] [--forward-only]
        [--varlen]
    PYTHONPATH=DIR/pkg python bench/bench_attention.py --passes bwd --impls fa3 flashattention3

Only what the sweep runs is compiled: bf16, the head dims asked for, forward and
backward, without FP8, fp16, varlen, paged KV, split KV, local windows, softcap, packed
GQA, clusters and the SM8x kernels (its own DISABLE switches). --fp8 adds its e4m3
forward at the same head dims (for bench_attention.py --dtypes e4m3 --fp8-scales
descales). --forward-only leaves out its backward (its own DISABLE_BACKWARD switch), for
forward-only comparisons such as FP8's. --varlen keeps its varlen paths (for
bench_variants.py --varlen-only --yardstick; the same units, twice the instances).
--mha-only also leaves out the backward's GQA and deterministic instances, three
quarters of the backward's kernels (the sweep is MHA and non-deterministic); a source
whose switches are not found is built whole, with a warning. The CUTLASS headers are any
recent 3.x/4.x include directory (fa3's own, unpacked, were used on 2026-12-04). Needs
torch and nvcc; three head dims took under 3 minutes with 8 parallel jobs (MAX_JOBS sets
ninja's; default: every core).
"""

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

# The head dims FlashAttention-3 builds kernels for; its switches name them.
HEAD_DIMS = (64, 96, 128, 192, 256)
# Features the benchmark does not use, switched off by its DISABLE macros.
UNUSED = ("SPLIT", "PAGEDKV", "APPENDKV", "LOCAL", "SOFTCAP", "PACKGQA", "FP16", "FP8", "VARLEN", "CLUSTER", "SM8x",
          "HDIMDIFF64", "HDIMDIFF192")
# Every switch its Python interface reads from the generated flash_attn_config module.
CONFIG_SWITCHES = ("BACKWARD", "SPLIT", "PAGEDKV", "APPENDKV", "LOCAL", "SOFTCAP", "PACKGQA", "FP16", "FP8", "VARLEN",
                   "CLUSTER", "HDIM64", "HDIM96", "HDIM128", "HDIM192", "HDIM256", "SM8x")
NVCC_FLAGS = ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "-DNDEBUG", "--expt-relaxed-constexpr",
              "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED", "-DCUTLASS_ENABLE_GDC_FOR_SM90",
              "-DCUTLASS_DEBUG_TRACE_LEVEL=0", "-gencode", "arch=compute_90a,code=sm_90a"]
# Its stable-ABI binding targets torch 2.9 and later.
CXX_FLAGS = ["-O3", "-std=c++17", "-DTORCH_TARGET_VERSION=0x0209000000000000"]

# --mha-only: the backward dispatch's run-time switches on GQA and on deterministic mode
# become compile-time false. The macro keeps the switch's call shape, so only the
# opening token changes and every brace of the source stays as it is.
FALSE_SWITCH = "#define YARDSTICK_FALSE_SWITCH(NAME, ...) [&] { constexpr static bool NAME = false; return __VA_ARGS__(); }()\n"
MHA_ONLY_SWITCHES = (
    re.compile(r"BOOL_SWITCH\(\s*params\.h\s*!=\s*params\.h_k\s*,\s*(\w+)\s*,"),
    re.compile(r"BOOL_SWITCH\(\s*params\.deterministic\s*,\s*(\w+)\s*,"),
)


def disabled_macros(head_dims, fp8=False, forward_only=False, varlen=False):
    """The FLASHATTENTION_DISABLE_* macros of a build for `head_dims` (with its FP8
    forward: `fp8`; without its backward: `forward_only`; with its varlen paths: `varlen`)."""
    kept = {"FP8"} if fp8 else set()
    if varlen:
        kept.add("VARLEN")
    macros = ["FLASHATTENTION_DISABLE_" + name for name in UNUSED if name not in kept]
    if forward_only:
        macros.append("FLASHATTENTION_DISABLE_BACKWARD")
    macros += [f"FLASHATTENTION_DISABLE_HDIM{h}" for h in HEAD_DIMS if h not in head_dims]
    return macros


def config_module(head_dims, fp8=False, forward_only=False, varlen=False):
    """Text of the flash_attn_config module its interface imports (its setup.py writes
    one): which switches the build was made with."""
    off = set(disabled_macros(head_dims, fp8, forward_only, varlen))
    flags = {f"FLASHATTENTION_DISABLE_{name}": f"FLASHATTENTION_DISABLE_{name}" in off for name in CONFIG_SWITCHES}
    flags["FLASH_ATTENTION_DISABLE_HDIMDIFF64"] = True
    flags["FLASH_ATTENTION_DISABLE_HDIMDIFF192"] = True
    return f"CONFIG = {{'build_flags': {flags!r}}}\n"


def sources(src, head_dims, fp8=False, forward_only=False):
    """Translation units: the binding, the scheduler's, and one forward and (unless
    `forward_only`) one backward unit per head dim (bf16, Hopper), and with `fp8` an e4m3
    forward unit per head dim."""
    units = [src / "flash_api_stable.cpp", src / "flash_prepare_scheduler.cu"]
    passes = ("fwd",) if forward_only else ("fwd", "bwd")
    for h in head_dims:
        units += [src / "instantiations" / f"flash_{d}_hdim{h}_bf16_sm90.cu" for d in passes]
        if fp8:
            units.append(src / "instantiations" / f"flash_fwd_hdim{h}_e4m3_sm90.cu")
    return units


def mha_only(text):
    """(text with the GQA and deterministic switches fixed to false, how many were)."""
    count = 0
    for pattern in MHA_ONLY_SWITCHES:
        text, n = pattern.subn(r"YARDSTICK_FALSE_SWITCH(\1,", text)
        count += n
    return (FALSE_SWITCH + text if count else text), count


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, help="a checkout of flash-attention (its hopper/ is built)")
    parser.add_argument("--cutlass", type=Path, required=True, help="a CUTLASS include directory (cute/, cutlass/)")
    parser.add_argument("--out", type=Path, required=True, help="build directory; the package lands in OUT/pkg")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256], choices=HEAD_DIMS)
    parser.add_argument("--mha-only", action="store_true", help="no GQA or deterministic backward instances")
    parser.add_argument("--fp8", action="store_true", help="also its e4m3 forward at the same head dims")
    parser.add_argument("--forward-only", action="store_true", help="no backward kernels")
    parser.add_argument("--varlen", action="store_true", help="keep its varlen paths (flash_attn_varlen_func)")
    args = parser.parse_args(argv)
    if not (args.source / "hopper" / "flash_api_stable.cpp").is_file():
        parser.error(f"--source: no hopper/flash_api_stable.cpp under {args.source}")
    if not (args.cutlass / "cute" / "tensor.hpp").is_file():
        parser.error(f"--cutlass: no cute/tensor.hpp under {args.cutlass}")
    return args


def main(argv=None):
    args = parse_args(argv)
    head_dims = sorted(set(args.head_dims))
    src = args.out / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(args.source / "hopper", src)
    if args.mha_only:
        template = src / "flash_bwd_launch_template.h"
        text, count = mha_only(template.read_text())
        if count != 2:
            print(f"warning: {count} of the 2 switches found in {template.name}: building every instance",
                  file=sys.stderr)
        else:
            template.write_text(text)
    pkg = args.out / "pkg"
    (pkg / "flash_attn_3").mkdir(parents=True, exist_ok=True)
    (pkg / "flash_attn_3" / "__init__.py").write_text("")
    (pkg / "flash_attn_config.py").write_text(config_module(head_dims, args.fp8, args.forward_only, args.varlen))
    shutil.copy(src / "flash_attn_interface.py", pkg / "flash_attn_interface.py")

    from torch.utils.cpp_extension import load

    defines = ["-D" + m for m in disabled_macros(head_dims, args.fp8, args.forward_only, args.varlen)]
    build = args.out / "build"
    build.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    units = sources(src, head_dims, args.fp8, args.forward_only)
    load(name="_C", sources=[str(s) for s in units], extra_cflags=CXX_FLAGS + defines,
         extra_cuda_cflags=NVCC_FLAGS + defines, extra_include_paths=[str(src), str(args.cutlass)],
         build_directory=str(build), is_python_module=False, verbose=True)
    shutil.copy(build / "_C.so", pkg / "flash_attn_3" / "_C.so")
    print(f"built: PYTHONPATH={pkg.resolve()}")


if __name__ == "__main__":
    main()
