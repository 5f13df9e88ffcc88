"""The approver's decision store over a month (issue 33): every decision stayed in memory until a
restart compacted the file (a coordinating fleet approver grew by 47 MB over 20 waves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.approver import store as module
from bridge.approver.store import DecisionStore
from bridge.streams.base import Position


class Clock:
    def __init__(self) -> None:
        self.now = 1_795_000_000.0

    def time(self) -> float:
        return self.now


def test_decisions_are_forgotten_after_they_can_no_longer_be_valid_and_the_file_shrinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(module, "time", clock)
    monkeypatch.setattr(module, "COMPACT_AT", 1_000)
    store = DecisionStore(tmp_path, keep=3600.0)
    for wave in range(20):  # a wave an hour and a half apart
        for n in range(200):
            decision_id = f"w{wave}-d{n}"
            store.started(decision_id, Position("line", n), sync=False)
            store.final(decision_id, Position("line", n), "approved", None, sync=False)
        clock.now += 5400
        assert len(store) <= 200  # only the last wave's: the older ones can no longer be replayed
    store.sync()
    assert len(store.path.read_bytes().splitlines()) <= 4 * 200 + 400  # rewritten while running
    kept = store.get("w19-d7")
    assert kept is not None and (kept.state, kept.outcome, kept.position) == ("final", "approved", "line@7")
    assert store.get("w0-d7") is None
    store.close()
    clock.now -= 5400  # a restart right after the last wave
    again = DecisionStore(tmp_path, keep=3600.0)  # what it reads back
    assert again.get("w19-d7") == kept and again.get("w18-d7") is None
    again.close()


def test_a_torn_last_line_is_skipped_and_a_started_decision_is_resumed(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path)
    store.started("d-1", Position("line", 3))
    store.close()
    with (tmp_path / "decisions.jsonl").open("ab") as f:
        f.write(b'{"decisionId": "d-2", "sta')
    again = DecisionStore(tmp_path)
    entry = again.get("d-1")
    assert entry is not None and entry.state == "started" and entry.outcome is None
    assert again.get("d-2") is None
    again.close()
