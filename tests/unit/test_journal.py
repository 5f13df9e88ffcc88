"""The keyed journal (bridge/shell/journal.py) that keeps Azure's channel's event states and pins."""

from __future__ import annotations

from pathlib import Path

from bridge.shell.journal import Journal, Live


def test_the_last_value_wins_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    journal.append([("a", "1"), ("b", "1")], {"a": "1", "b": "1"})
    journal.append([("a", "2")], {"a": "2", "b": "1"})
    with (tmp_path / "j.jsonl").open("ab") as f:
        f.write(b'{"k": "b", "v"')  # a kill -9 mid-write
    assert Journal(tmp_path / "j.jsonl").load() == {"b": "1", "a": "2"}


def test_a_live_map_is_built_only_when_the_file_is_rewritten(tmp_path: Path) -> None:
    """Azure's channel built the map of every tracked event at each delivery for this size check:
    O(events) per delivery, the top of its CPU profile (bench/azure_bench.py)."""
    builds: list[int] = []
    live = {f"e{n}": "Scheduled" for n in range(1000)}

    def build() -> dict[str, str]:
        builds.append(1)
        return live

    journal = Journal(tmp_path / "j.jsonl")
    for n in range(4000):
        journal.append([(f"e{n % 1000}", "Scheduled")], Live(len(live), build))
    assert builds == []  # 4 000 lines: not yet past four times what is live
    live["e0"] = "Started"  # the caller's map holds what it appends (the tracker's does)
    journal.append([("e0", "Started")], Live(len(live), build))
    assert builds == [1]
    assert Journal(tmp_path / "j.jsonl").load() == live
    assert len((tmp_path / "j.jsonl").read_bytes().splitlines()) == 1000
