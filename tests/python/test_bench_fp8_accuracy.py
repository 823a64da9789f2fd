"""bench/fp8_accuracy.py on the CPU path, at a small size: one record per variant,
the fields the perf log reads, and errors in the order the formats imply."""

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fp8_accuracy  # noqa: E402


def test_records_on_the_cpu_path(tmp_path):
    out = tmp_path / "fp8.json"
    argv = ["--seqlen", "256", "--heads", "2", "--head-dim", "64", "--block", "64", "--out", str(out)]
    assert fp8_accuracy.main(argv) == 0
    records = json.loads(out.read_text())
    assert [(r["dtype"], r["variant"]) for r in records] == [
        ("bf16", "bf16"),
        ("e4m3", "per-tensor"),
        ("e4m3", "block"),
        ("e4m3", "block+hadamard"),
    ]
    rmse = {r["variant"]: r["rmse"] for r in records}
    assert all(0 < e < 5e-2 for e in rmse.values()), rmse
    # FP8 rounds P and the inputs far more coarsely than bf16.
    assert min(rmse["per-tensor"], rmse["block"], rmse["block+hadamard"]) > 2 * rmse["bf16"], rmse
    assert all(r["seqlen"] == 256 and r["device"] == "cpu" for r in records)


def test_per_tensor_scale_undoes_itself():
    x = torch.randn(1, 8, 2, 64) * 3
    codes, descale = fp8_accuracy.per_tensor(x)
    assert codes.dtype == torch.float8_e4m3fn and descale.shape == (1, 2)
    assert codes.float().abs().max() == 448
    assert torch.allclose(codes.float() * descale[0, 0], x, rtol=2**-4, atol=descale[0, 0].item() * 2**-9)
