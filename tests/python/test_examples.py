"""The serving example (examples/serve_decode.py) on the CPU path: its last decode step
equals plain attention of that step's queries over the keys and values its paged cache
then holds, so the prefill and every append went where the page table says; and the
script runs from the command line."""

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "serve_decode.py"


def gathered(cache, page_table, length):
    """Positions [0, length) of one sequence's paged cache, as (1, length, heads, dim)."""
    page_size = cache.shape[1]
    pos = torch.arange(length)
    pages = page_table[pos // page_size].long()
    return cache[pages, pos % page_size].unsqueeze(0)


def test_last_step_equals_attention_over_the_gathered_cache():
    serve = runpy.run_path(str(EXAMPLE))["serve"]
    prompt_lens = (37, 100, 5, 250)
    q, out, (k_cache, v_cache, page_table, cache_seqlens) = serve(prompt_lens, steps=3, device="cpu")
    assert cache_seqlens.tolist() == [n + 3 for n in prompt_lens]
    for b, length in enumerate(cache_seqlens.tolist()):
        k = gathered(k_cache, page_table[b], length)
        v = gathered(v_cache, page_table[b], length)
        want = fa3.flash_attn_func(q[b : b + 1], k, v, causal=True)
        # Both are bf16 results of fp32 sums taken in different orders: a rounding or two apart.
        torch.testing.assert_close(out[b : b + 1], want, atol=2e-3, rtol=2e-2)


def test_runs_from_the_command_line():
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "2", "--device", "cpu"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "out[0] = " in done.stdout and "after 2 decode steps (cpu)" in done.stdout
