"""The approver's memory of decisions: replay protection that survives restarts.

``<state-dir>/decisions.jsonl`` is an append-only log, one line per state change of a decision:
``{"decisionId", "state": "started"|"final", "position", "outcome", "at"}``. On start it is read back
(and compacted when it grew large), so:

* a decision id that reached a final outcome is never acted on again: a second message carrying it
  is a replay and is refused (``replayed``), unless it is the *same message* read again after a crash
  before its offset was committed, which is recognised by its source position and simply committed;
* a decision that was started but not finished (the approver died mid-way) is resumed: relaying it
  again is safe because the agent answers a repeated decision id from its own ledger without posting
  a second StartRequest.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from bridge.streams.base import Position
from bridge.support.fsutil import datasync, write_atomic

#: A file of fewer lines is never rewritten (nor read back twice at start).
COMPACT_AT = 20_000
#: The default memory: the longest a decision can live under the default policy, with margin.
KEEP_SECONDS = 7 * 24 * 3600.0

State = Literal["started", "final"]


@dataclass(frozen=True, slots=True)
class Stored:
    """What the store knows of one decision."""

    decision_id: str
    state: State
    position: str  # of the message that carried it (a re-read after a crash is the same message)
    at: float
    outcome: str | None = None  # final only
    reason: str | None = None

    def to_json(self) -> bytes:
        entry: dict[str, object] = {"decisionId": self.decision_id, "state": self.state,
                                    "position": self.position, "at": self.at}  # fmt: skip
        if self.state == "final":
            entry.update(outcome=self.outcome, reason=self.reason)
        return orjson.dumps(entry) + b"\n"

    @classmethod
    def of(cls, line: bytes) -> Stored | None:
        try:
            entry = orjson.loads(line)
            state = entry["state"]
            if state not in ("started", "final"):
                return None
            position, at = str(entry.get("position") or ""), float(entry.get("at") or 0)
            return cls(
                str(entry["decisionId"]), state, position, at, entry.get("outcome"), entry.get("reason")
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None  # a torn last line after a crash


class DecisionStore:
    def __init__(self, state_dir: Path, keep: float = KEEP_SECONDS) -> None:
        self.path = state_dir / "decisions.jsonl"
        self.keep = keep
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Stored] = OrderedDict()  # the oldest write first
        self._lines = 0
        if self.path.exists():
            for line in self.path.read_bytes().splitlines():
                self._lines += 1
                entry = Stored.of(line)
                if entry is not None:
                    self._remember(entry)
        self._forget_old(time.time())
        if self._lines > COMPACT_AT:
            self._compact()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def get(self, decision_id: str) -> Stored | None:
        with self._lock:
            return self._entries.get(decision_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def started(self, decision_id: str, position: Position, *, sync: bool = True) -> None:
        """Record that the decision is being acted on. ``sync=False`` leaves the line for the
        caller's :meth:`sync` (one disk sync for a lane's whole batch, before it is relayed)."""
        self._write(Stored(decision_id, "started", str(position), time.time()), sync)

    def final(
        self, decision_id: str, position: Position, outcome: str, reason: str | None, *, sync: bool = True
    ) -> None:
        """Record the decision's outcome (``sync`` as for :meth:`started`: before its commit)."""
        self._write(Stored(decision_id, "final", str(position), time.time(), outcome, reason), sync)

    def sync(self) -> None:
        """Make every line written so far durable."""
        datasync(self._fd)

    def close(self) -> None:
        os.close(self._fd)

    def _write(self, entry: Stored, sync: bool) -> None:
        with self._lock:
            self._remember(entry)
            os.write(self._fd, entry.to_json())
            self._lines += 1
            self._forget_old(entry.at)
            if self._lines > COMPACT_AT and self._lines > 4 * len(self._entries):
                self._compact_open()
        if not sync:
            return
        # Durable before returning, but synced outside the lock: the lanes' writes then share their
        # syncs (one fdatasync covers every line written before it) instead of queueing behind each
        # other's, and ``get`` never waits for the disk. With 8 lanes, syncing under the lock made
        # the store the fleet approver's bottleneck in bench/fleet_bench.py's burst.
        datasync(self._fd)

    def _remember(self, entry: Stored) -> None:
        self._entries.pop(entry.decision_id, None)
        self._entries[entry.decision_id] = entry  # newest last

    def _forget_old(self, now: float) -> None:
        cutoff = now - self.keep
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.at >= cutoff:
                break
            self._entries.popitem(last=False)

    def _compact(self) -> None:
        write_atomic(self.path, b"".join(e.to_json() for e in self._entries.values()))
        self._lines = len(self._entries)

    def _compact_open(self) -> None:
        """Rewrite the file as what is remembered while running (under the lock): the new file is
        durable and in place before the old descriptor is let go."""
        self._compact()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.close(self._fd)
        self._fd = fd
