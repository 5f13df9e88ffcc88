"""Each sink's position in the outbox: the last seq it confirmed, in memory and in
``cursors/<sink-id>``.

Why apart from the outbox: a cursor is the one piece of outbox state written on every delivery, and
its faults are not the segments' faults. A cursor that cannot be written (ENOSPC, EMFILE) must never
stop delivery: the position moves on in memory, stays pending, and is written with the next
confirmation; a restart before that re-sends a few records (same ids). Files are replaced atomically
but not fsynced (an fsync per delivery for a few re-sent records after a power loss is a bad trade).
Every configured sink's file is written when the sink is first seen, so a sink that has not confirmed
anything yet keeps its own position across restarts instead of borrowing another's.

Locking: positions are read and moved under the outbox's lock (:meth:`SinkCursors.advance` is cheap);
:meth:`SinkCursors.save` runs without it, so an append never waits for a file replace.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from bridge.pipeline.metrics import PipelineMetrics
from bridge.support.fsutil import ensure_private_dir, write_atomic
from bridge.support.observability import ErrorStreak

log = logging.getLogger("bridge.pipeline.outbox")  # one logger name for the outbox's lines


class SinkCursors:
    """The positions of a fixed set of sinks."""

    def __init__(self, directory: Path, sink_ids: list[str], metrics: PipelineMetrics | None) -> None:
        ensure_private_dir(directory)
        self._paths = {sid: directory / sid for sid in sink_ids}
        self._metrics = metrics
        self._state = threading.Lock()  # _positions and _unsaved (taken inside the outbox's lock)
        self._writing = threading.Lock()  # file writes in order: a newer value never replaced by an older
        self._positions: dict[str, int] = {}
        self._unsaved: set[str] = set()
        self._streak = ErrorStreak(log, "saving sink cursors")

    def recover(self, oldest: int) -> None:
        """Each sink's saved position; a sink seen for the first time starts where the slowest known
        sink is (what the outbox still holds for it), or at ``oldest`` (the seq before the oldest
        record on disk), and its file is written at once."""
        saved = {sid: self._read(sid) for sid in self._paths}
        known = [c for c in saved.values() if c is not None]
        start = min(known) if known else oldest
        with self._state:
            for sid, cursor in saved.items():
                if cursor is None:
                    log.info(
                        "new sink starts with what the outbox holds", extra={"sink": sid, "after": start}
                    )
                    cursor = start
                    self._unsaved.add(sid)
                self._positions[sid] = cursor
        self.save()

    def __getitem__(self, sink_id: str) -> int:
        with self._state:
            return self._positions[sink_id]

    def floor(self) -> int:
        """The slowest sink's position: everything up to it is confirmed by every sink."""
        with self._state:
            return min(self._positions.values())

    def highest(self) -> int:
        with self._state:
            return max(self._positions.values())

    def advance(self, sink_id: str, seq: int) -> bool:
        """Move ``sink_id`` to ``seq`` (never back); False when it already was there or past it."""
        with self._state:
            if seq <= self._positions[sink_id]:
                return False
            self._positions[sink_id] = seq
            self._unsaved.add(sink_id)
            return True

    def save(self) -> None:
        """Write the positions not yet on disk; one that fails stays pending for the next call."""
        with self._writing:
            with self._state:
                pending = {sid: self._positions[sid] for sid in self._unsaved}
                self._unsaved.clear()
            for sid, value in list(pending.items()):
                try:
                    write_atomic(self._paths[sid], b"%d\n" % value, durable=False)
                except OSError as err:
                    with self._state:
                        self._unsaved.update(pending)
                    if self._metrics is not None:
                        self._metrics.outbox_write_errors.labels("cursor").inc()
                    self._streak.failure(err.__class__.__name__, f"{sid}: {err}", sink=sid)
                    return
                del pending[sid]
            self._streak.success()

    def _read(self, sink_id: str) -> int | None:
        try:
            text = self._paths[sink_id].read_text().strip()
        except FileNotFoundError:
            return None
        if text.isascii() and text.isdigit():
            return int(text)
        log.error("unreadable cursor file, sink starts from the oldest record", extra={"sink": sink_id})
        return 0
