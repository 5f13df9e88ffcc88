"""The durable outbox: ordering, per-sink cursors, trimming, limits and crash recovery."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bridge.agent.outbox import Outbox, OutboxFull
from bridge.observability import AgentMetrics


def payload(i: int) -> bytes:
    return b'{"n":%d,"pad":"%s"}' % (i, b"x" * 100)


def test_entries_come_back_in_order_per_sink(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a", "b"])
    for i in range(5):
        box.append(f"r{i}", payload(i))
    assert [e.seq for e in box.read(0)] == [1, 2, 3, 4, 5]
    assert [e.payload for e in box.read(3)] == [payload(3), payload(4)]
    box.ack("a", 5)
    assert box.depth("a") == 0 and box.depth("b") == 5
    assert box.pending[0] == 5  # b still needs them all
    box.ack("b", 2)
    assert box.pending[0] == 3


def test_cursors_and_records_survive_a_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a", "b"])
    for i in range(4):
        box.append(f"r{i}", payload(i))
    box.ack("a", 4)
    box.ack("b", 1)
    box.close()
    again = Outbox(tmp_path, ["a", "b"])
    assert again.cursor("a") == 4 and again.cursor("b") == 1
    assert [e.record_id for e in again.read(again.cursor("b"))] == ["r1", "r2", "r3"]
    assert again.append("r4", payload(4)).seq == 5
    assert again.last().record_id == "r4"


def test_new_sink_starts_with_what_is_still_held(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a"])
    for i in range(3):
        box.append(f"r{i}", payload(i))
    box.ack("a", 1)
    box.close()
    again = Outbox(tmp_path, ["a", "new"])
    assert again.cursor("new") == 1  # the slowest known sink's position: nothing held is skipped


def test_segments_are_trimmed_once_every_sink_confirmed(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a"], segment_bytes=500)
    for i in range(20):
        box.append(f"r{i}", payload(i))
    segments = sorted(tmp_path.glob("seg-*.log"))
    assert len(segments) > 3
    box.ack("a", 20)
    left = sorted(tmp_path.glob("seg-*.log"))
    assert left == segments[-1:]  # the active segment stays (it holds the newest record and the seq)
    box.close()
    again = Outbox(tmp_path, ["a"])
    assert again.append("r20", payload(20)).seq == 21
    assert again.last().seq == 21


def test_limits_refuse_new_records_until_sinks_catch_up(tmp_path: Path) -> None:
    metrics = AgentMetrics()
    box = Outbox(tmp_path, ["a"], max_records=3, metrics=metrics)
    for i in range(3):
        box.append(f"r{i}", payload(i))
    with pytest.raises(OutboxFull):
        box.append("r3", payload(3))
    box.ack("a", 1)
    assert box.append("r3", payload(3)).seq == 4
    bytes_box = Outbox(tmp_path / "b", ["a"], max_bytes=4096)
    with pytest.raises(OutboxFull):
        for i in range(100):
            bytes_box.append(f"r{i}", payload(i))
    assert metrics.outbox_records._value.get() == 3


def test_torn_tail_is_cut_and_corrupt_frames_are_skipped(tmp_path: Path) -> None:
    metrics = AgentMetrics()
    box = Outbox(tmp_path, ["a"])
    for i in range(3):
        box.append(f"r{i}", payload(i))
    box.close()
    (segment,) = tmp_path.glob("seg-*.log")
    data = segment.read_bytes()
    lines = data.splitlines(keepends=True)
    corrupt = lines[1].replace(b'"n":1', b'"n":7')  # CRC no longer matches
    segment.write_bytes(lines[0] + corrupt + lines[2] + b"4 r3 1700000000000 0000")  # and a torn 4th frame
    again = Outbox(tmp_path, ["a"], metrics=metrics)
    assert [e.record_id for e in again.read(0)] == ["r0", "r2"]
    assert metrics.outbox_corrupt._value.get() == 2
    assert segment.read_bytes().endswith(b"\n")
    assert again.append("r3", payload(3)).seq == 4


def test_a_record_is_durable_once_append_returns_even_under_sigkill(tmp_path: Path) -> None:
    """A child appends and SIGKILLs itself right after append returns; the parent recovers it."""
    script = textwrap.dedent(f"""
        import os, signal
        from bridge.agent.outbox import Outbox
        box = Outbox({str(tmp_path)!r}, ["a"])
        for i in range(50):
            box.append(f"r{{i}}", b'{{"i":%d}}' % i)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -9
    again = Outbox(tmp_path, ["a"])
    assert [e.record_id for e in again.read(0, 100)] == [f"r{i}" for i in range(50)]


def test_payload_must_be_one_line(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a"])
    with pytest.raises(ValueError):
        box.append("r", b"a\nb")
    assert not os.listdir(tmp_path / "cursors")
