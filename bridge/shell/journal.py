"""A key -> value map kept in a state directory, for state that decides what a service publishes.

Written as JSON Lines (``{"k": key, "v": value}``), appended and fsynced, read back at start with the
last value of each key winning and a torn last line (a kill -9 mid-write) skipped; rewritten whole
when the file has grown past four times what it still holds: the whole map is held in memory, so it
suits a map the size of the fleet. Azure's channel keeps its agents' pinned identities in one
(``agent-pins.jsonl``); its events' states, which grow with the month, moved to SQLite
(bridge.azure.tracker), and its earlier ``azure-states.jsonl`` is read once with this class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

from bridge.support.fsutil import append_durably, write_atomic


@dataclass(frozen=True)
class Live:
    """What a journal still holds, built only when the journal is rewritten."""

    size: int
    build: Callable[[], Mapping[str, str]]


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lines = 0

    def load(self) -> dict[str, str]:
        """What the file holds, in the order the keys were last written."""
        out: dict[str, str] = {}
        if not self.path.exists():
            return out
        for line in self.path.read_bytes().splitlines():
            self._lines += 1
            try:
                item = orjson.loads(line)
                key, value = str(item["k"]), str(item["v"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # a torn last line: its key is written again at its next change
            out.pop(key, None)
            out[key] = value
        return out

    def append(self, items: Iterable[tuple[str, str]], live: Mapping[str, str] | Live) -> None:
        """Make ``items`` durable (one fsync); when the file holds four times more lines than
        ``live`` (all that is still wanted) and over a thousand, rewrite it as ``live``.

        ``live`` may be a :class:`Live` (its size, and a function building the map): a caller whose
        live map must be built (Azure's channel's event states) builds it only when the file is
        rewritten, not at every append (built each time, it cost O(events tracked) per delivery)."""
        lines = [orjson.dumps({"k": k, "v": v}) + b"\n" for k, v in items]
        if not lines:
            return
        size = live.size if isinstance(live, Live) else len(live)
        if self._lines + len(lines) > 4 * max(size, 1000):
            wanted = live.build() if isinstance(live, Live) else live
            write_atomic(
                self.path, b"".join(orjson.dumps({"k": k, "v": v}) + b"\n" for k, v in wanted.items())
            )
            self._lines = len(wanted)
        else:
            append_durably(self.path, b"".join(lines))
            self._lines += len(lines)
