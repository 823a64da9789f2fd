"""scripts/ncu_hotspots.py on a small stand-in of Nsight Compute's per-instruction CSV:
opcodes without predicates or modifiers, and the stall reasons' samples by opcode
(the "(Not Issued)" columns being subsets, they are not reasons of their own)."""

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import ncu_hotspots  # noqa: E402


def test_opcode_drops_predicate_and_modifiers():
    assert ncu_hotspots.opcode("@!P0 MUFU.EX2 R1, R2") == "MUFU"
    assert ncu_hotspots.opcode("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24") == "HGMMA"
    assert ncu_hotspots.opcode("  SHFL.IDX PT, R0, R1, R2, 0x1f") == "SHFL"
    assert ncu_hotspots.opcode("") == ""


HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_wait", "stall_wait (Not Issued)",
          "stall_barrier"]
ROWS = [
    ["0x10", "MUFU.EX2 R1, R1", "30", "20", "15", "10"],
    ["0x20", "@P0 MUFU.EX2 R2, R2", "12", "12", "9", "0"],
    ["0x30", "SHFL.IDX PT, R3, R4, R5, 0x1f", "5", "5", "1", "0"],
    ["0x40", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", "40", "0", "0", "40"],
]


def write_csv(path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["==PROF== a line before the table"])
        w.writerow(HEADER)
        w.writerows(ROWS)


def test_reasons_by_opcode(tmp_path):
    table = ncu_hotspots.by_opcode(HEADER, ROWS, 1, [3, 4, 5])
    assert [name for name, _, _ in table] == ["stall_barrier", "stall_wait"]
    assert table[0] == ("stall_barrier", 50.0, [("BAR", 40.0), ("MUFU", 10.0)])
    assert table[1] == ("stall_wait", 37.0, [("MUFU", 32.0), ("SHFL", 5.0)])


def test_main_prints_the_opcode_table(tmp_path, capsys):
    path = tmp_path / "source.csv"
    write_csv(path)
    assert ncu_hotspots.main(str(path), top=2) == 0
    out = capsys.readouterr().out
    assert "87 stall samples; top 2 instructions:" in out
    assert "stall_wait 37: MUFU 32, SHFL 5" in out
    assert "stall_barrier 50: BAR 40, MUFU 10" in out
