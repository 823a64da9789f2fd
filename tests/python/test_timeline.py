"""scripts/timeline.py on a timeline file written as the forward's launch writes one
(src/hopper/timeline.h): the header, the kernel's name, each stream's count and records;
the spans it reports between a warpgroup's stamps, and the files it refuses."""

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import timeline  # noqa: E402

TILE_START, TURN, SCORES, PROBS, PV_DONE, TILE_END = range(6)


def word(event, block=0, m_block=0, pair=0):
    return event | block << 8 | m_block << 24 | pair << 40


def launch(streams, capacity=16, name=b"fwd_kernel<test>"):
    """One launch's bytes: streams is a list of [(clock, word), ...]."""
    out = struct.pack("<8s6I", b"fa3tl01\0", len(streams), 2, capacity, 128, 1980000, len(name)) + name
    for records in streams:
        body = [len(records)]
        for clock, w in records[:capacity]:
            body += [clock, w]
        body += [0] * (2 * (capacity - min(len(records), capacity)))
        out += struct.pack(f"<{len(body)}Q", *body)
    return out


# One tile of three key blocks (2, 1, 0): the first block without a P·V before it, two
# blocks with one, the last P·V on its own; then the next tile starts.
TILE = [
    (1000, word(TILE_START, 3, 7, 1)),
    (1100, word(TURN, 2)),
    (1600, word(SCORES, 2)),
    (2400, word(PROBS, 2)),
    (2600, word(TURN, 1)),
    (3100, word(SCORES, 1)),
    (3900, word(PROBS, 1)),
    (3950, word(PV_DONE, 1)),
    (4200, word(TURN, 0)),
    (4700, word(SCORES, 0)),
    (5500, word(PROBS, 0)),
    (5560, word(PV_DONE, 0)),
    (5800, word(TURN, 65535)),
    (6300, word(PV_DONE, 65535)),
    (6700, word(TILE_END, 0)),
    (6750, word(TILE_START, 3, 6, 1)),
]


def test_unpack_matches_the_kernels_layout():
    assert timeline.unpack(word(PV_DONE, 513, 127, 40000)) == (PV_DONE, 513, 127, 40000)


def test_spans_of_a_tile():
    s = timeline.spans(TILE)
    assert s["tile set-up"] == [100]
    assert s["issue->S"] == [500, 500, 500]
    assert s["softmax"] == [800, 800, 800]
    assert s["P·V wait"] == [50, 60]
    assert s["->turn"] == [200, 250, 240]  # from P (first block), then from each P·V's end
    assert s["block"] == [1500, 1600, 1600]
    assert s["last P·V"] == [500]
    assert s["tile end"] == [400]
    assert s["between tiles"] == [50]


def test_reads_launches_and_summarizes(tmp_path, capsys):
    path = tmp_path / "t.bin"
    path.write_bytes(launch([TILE, TILE[:5]]) + launch([TILE], capacity=4))
    launches = list(timeline.read_launches(path.read_bytes()))
    assert len(launches) == 2
    header, name, streams = launches[0]
    assert header["streams"] == 2 and header["block_n"] == 128 and name == "fwd_kernel<test>"
    assert streams[0] == TILE and streams[1] == TILE[:5]
    assert len(launches[1][2][0]) == 4  # a full stream keeps its first records
    assert timeline.main([str(path), "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "softmax" in out and "1 streams full" in out
    summary = timeline.summarize(streams)
    assert summary["softmax"]["median"] == 800 and summary["softmax"]["n"] == 4  # three blocks and one


def test_refuses_truncated_and_foreign_files():
    data = launch([TILE])
    with pytest.raises(ValueError, match="truncated"):
        list(timeline.read_launches(data[:-8]))
    with pytest.raises(ValueError, match="not a timeline"):
        list(timeline.read_launches(b"x" * 40))
