"""bench/bench_context_parallel.py where no GPU is needed: its arithmetic, records and
options, NCCL_NVLS_ENABLE's default, and a whole --tiny run over gloo on the CPU with
two processes under torchrun, killed past a deadline.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_context_parallel as bench  # noqa: E402

DEADLINE_S = 420


@pytest.mark.parametrize(
    "seqlen, world_size, causal, ok",
    [
        (64, 2, False, True),
        (64, 2, True, True),
        (6, 3, True, True),
        (9, 3, False, True),
        (9, 3, True, False),
        (2**20, 8, True, True),
        (10, 4, False, False),
    ],
)
def test_splittable_needs_2w_zigzag_chunks_when_causal(seqlen, world_size, causal, ok):
    assert bench.splittable(seqlen, world_size, causal) is ok


def test_full_inputs_of_1m_tokens_are_20_gib():
    # q and dout: 32 heads, k and v: 8 heads, of 128 bf16 values per token.
    assert bench.full_input_bytes(2**20) == 20 * 2**30
    assert bench.full_input_bytes(10, nheads=2, nheads_kv=1, hdim=4, batch=3, itemsize=4) == 3 * 10 * 6 * 4 * 4


@pytest.mark.parametrize(
    "first_ms, budget_ms, expected", [(100.0, 1000.0, 10), (1.0, 1000.0, 50), (5000.0, 1000.0, 3), (0.0, 1.0, 50)]
)
def test_iterations_fill_the_budget_within_bounds(first_ms, budget_ms, expected):
    assert bench.iterations(first_ms, budget_ms, 3, 50) == expected


def test_a_calls_time_is_its_slowest_ranks():
    times = [[1.0, 5.0], [2.0, 2.5], [9.0, 3.0]]  # slowest per call: 5, 2.5, 9
    assert bench.median_of_slowest(times) == 5.0


@pytest.mark.parametrize(
    "ms, comm, compute, hidden",
    [
        (10.0, 4.0, 10.0, 1.0),
        (14.0, 4.0, 10.0, 0.0),
        (12.0, 4.0, 10.0, 0.5),
        (15.0, 4.0, 10.0, 0.0),
        (9.0, 4.0, 10.0, 1.0),
        (10.0, 0.0, 10.0, 1.0),
    ],
)
def test_comm_hidden_is_the_share_of_the_transfers_the_overlap_removes(ms, comm, compute, hidden):
    assert bench.comm_hidden(ms, comm, compute) == pytest.approx(hidden)


def test_record_counts_whole_sequence_tokens_and_speedup():
    r = bench.record("fwd_bwd", "ring", 8, True, 2**20, 250.0, 1000.0, gpu="H200", comm_ms=3.0)
    assert r["tokens_per_s"] == pytest.approx(2**20 / 0.25)
    assert r["speedup"] == pytest.approx(4.0)
    fields = ("pass", "variant", "world_size", "causal", "seqlen", "comm_ms")
    assert tuple(r[f] for f in fields) == ("fwd_bwd", "ring", 8, True, 2**20, 3.0)
    assert (r["nheads"], r["nheads_kv"], r["hdim"], r["dtype"], r["batch"]) == (32, 8, 128, "bf16", 1)


def test_record_without_a_time_or_a_baseline():
    failed = bench.record("fwd", "torch_cp", 2, False, 4096, None, 3.0, error="no API", status="unavailable")
    assert failed["tokens_per_s"] is None and failed["speedup"] is None and failed["status"] == "unavailable"
    assert bench.record("fwd", "ring", 2, False, 4096, 2.0, None)["speedup"] is None


def test_tiny_takes_one_timed_call_and_small_lengths():
    args = bench.parse_args(["--tiny", "--backend", "gloo", "--device", "cpu"])
    assert (args.seqlens, args.min_iters, args.max_iters) == (bench.TINY_SEQLENS, 1, 1)
    assert (args.causal, args.passes, args.variants) == ([False, True], ["fwd", "fwd_bwd"], list(bench.VARIANTS))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "cpu"], "--backend nccl: takes --device cuda"),
        (["--seqlens", "0"], "--seqlens: lengths must be positive"),
        (["--min-iters", "5", "--max-iters", "2"], "need 1 <= min <= max"),
        (["--sm-margin", "-1"], "--sm-margin: SMs left free, >= 0"),
    ],
)
def test_bad_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def nvls_after_import(env):
    code = "import os, bench_context_parallel; print(os.environ['NCCL_NVLS_ENABLE'])"
    # The child runs in bench/: a PYTHONPATH relative to this process's directory (a
    # build tree's python/, say) would no longer find fa3 there.
    paths = env.get("PYTHONPATH", "").split(os.pathsep)
    env = {**env, "PYTHONPATH": os.pathsep.join(str(Path(p).resolve()) for p in paths if p)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCH, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return result.stdout.strip()


def test_nvls_is_off_unless_the_environment_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != "NCCL_NVLS_ENABLE"}
    assert nvls_after_import(env) == "0"
    assert nvls_after_import({**env, "NCCL_NVLS_ENABLE": "1"}) == "1"


def test_tiny_run_on_two_cpu_processes(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [str(BENCH / "bench_context_parallel.py"), "--backend", "gloo", "--device", "cpu", "--tiny"]
    command += ["--timeout-min", "5", "--out-dir", str(tmp_path), "--sm-margin", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the tiny run did not finish within {DEADLINE_S} s")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (path,) = tmp_path.glob("*-cpu-cp-w2.json")
    records = json.loads(path.read_text())
    keys = [(r["pass"], r["causal"], r["variant"]) for r in records]
    variants = ("one_gpu", "ring", "allgather", "torch_cp")
    assert keys == [(p, c, v) for c in (False, True) for p in ("fwd", "fwd_bwd") for v in variants]
    for r in records:
        assert r["seqlen"] == bench.TINY_SEQLENS[0] and r["backend"] == "gloo" and r["sm_margin"] == 4
        if r["variant"] == "torch_cp" and r["ms"] is None:  # PyTorch's CP is for GPUs: refusals are recorded
            assert r["status"] == "unavailable" and r["error"]
            continue
        assert r["ms"] > 0 and "error" not in r, r
        assert r["world_size"] == (1 if r["variant"] == "one_gpu" else 2)
        assert r["speedup"] == pytest.approx(baseline(records, r)["ms"] / r["ms"])
        if r["variant"] != "one_gpu":
            assert r["rel_err"] < bench.MAX_REL_ERR
        if r["variant"] == "ring":
            assert r["comm_ms"] > 0 and r["compute_ms"] > 0 and 0.0 <= r["comm_hidden"] <= 1.0


def baseline(records, r):
    """The one_gpu record of r's pass and mask."""
    same_point = [b for b in records if (b["pass"], b["causal"]) == (r["pass"], r["causal"])]
    return next(b for b in same_point if b["variant"] == "one_gpu")
