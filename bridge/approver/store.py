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
from pathlib import Path
from typing import Any

import orjson

from bridge.streams.base import Position
from bridge.support.fsutil import datasync, write_atomic

COMPACT_AT = 20_000
KEEP_SECONDS = 7 * 24 * 3600.0


class DecisionStore:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "decisions.jsonl"
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = {}
        lines = 0
        if self.path.exists():
            for line in self.path.read_bytes().splitlines():
                lines += 1
                try:
                    entry = orjson.loads(line)
                    self._entries[entry["decisionId"]] = entry
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line after a crash
        if lines > COMPACT_AT:
            self._compact()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def get(self, decision_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._entries.get(decision_id)

    def started(self, decision_id: str, position: Position, *, sync: bool = True) -> None:
        """Record that the decision is being acted on. ``sync=False`` leaves the line for the
        caller's :meth:`sync` (one disk sync for a lane's whole batch, before it is relayed)."""
        entry = {"decisionId": decision_id, "state": "started", "position": str(position), "at": time.time()}
        self._write(entry, sync)

    def final(
        self, decision_id: str, position: Position, outcome: str, reason: str | None, *, sync: bool = True
    ) -> None:
        """Record the decision's outcome (``sync`` as for :meth:`started`: before its commit)."""
        entry = {
            "decisionId": decision_id,
            "state": "final",
            "position": str(position),
            "outcome": outcome,
            "reason": reason,
            "at": time.time(),
        }
        self._write(entry, sync)

    def sync(self) -> None:
        """Make every line written so far durable."""
        datasync(self._fd)

    def close(self) -> None:
        os.close(self._fd)

    def _write(self, entry: dict[str, Any], sync: bool) -> None:
        with self._lock:
            self._entries[entry["decisionId"]] = entry
            os.write(self._fd, orjson.dumps(entry) + b"\n")
        if not sync:
            return
        # Durable before returning, but synced outside the lock: the lanes' writes then share their
        # syncs (one fdatasync covers every line written before it) instead of queueing behind each
        # other's, and ``get`` never waits for the disk. With 8 lanes, syncing under the lock made
        # the store the fleet approver's bottleneck in bench/fleet_bench.py's burst.
        datasync(self._fd)

    def _compact(self) -> None:
        cutoff = time.time() - KEEP_SECONDS
        keep = [e for e in self._entries.values() if e.get("at", 0) >= cutoff]
        self._entries = {e["decisionId"]: e for e in keep}
        write_atomic(self.path, b"".join(orjson.dumps(e) + b"\n" for e in keep))
