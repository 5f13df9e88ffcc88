"""Which observations of Azure's channel are news: duplicates dropped, no state moved back.

Event Grid documents at-least-once delivery with the same envelope ``id`` on a redelivery; Resource
Graph rows are updated in place and a poll returns unchanged rows again (an ended event's row too, for
as long as Resource Graph keeps it: Microsoft documents no bound); the two channels report the same
change twice. So an observation is news only when its content (status, NotBefore, VMs: a moved
NotBefore is news) was not seen for the event before. Deliveries also arrive out of order (a
``Completed`` before its ``Started``): the late one is still published, it happened, but the event's
state (``state`` in the record) never moves back.

**On disk, not in memory** (issue 33). What is known of each event (its state and the 64-bit digests
of the contents seen) decides what is published, so it must outlive a restart and a kill -9, and it
must be remembered for as long as Resource Graph may repeat the event's row: a month of waves is
200 000 events at 10 000 VMs. Held in memory that was 0.5 KB an event, 105 MB of heap after 20 waves
(``bench/azure_bench.py --month``); so it lives in ``<state-dir>/azure-events.sqlite`` (the standard
library's SQLite: WAL, ``synchronous=FULL``, one commit per batch) and memory holds only the batch
being stored. At most ``max_events`` events are kept, the least recently changed forgotten first;
forgetting one only makes its next observation news again (published again with the same, deterministic
``recordId``, which a consumer deduplicates as it must for any at-least-once stream).

The sequence per batch: :meth:`observe` each item (the answer is kept in memory, *pending*), the
records into the outbox, then :meth:`persist` (one commit); when the records cannot be stored,
:meth:`forget` drops the pending answer so the same deliveries are news when read again. A file that
cannot be read (corrupt, not a database) is moved aside and started over (counted in ``errors``): the
cost is the same as forgetting, never a service that does not start. Content digests are blake2b, not
``hash()``: Python salts string hashes per process, and these are compared across restarts.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast, get_args

import orjson

from bridge.azure.events import FINAL, AzureEvent, Status
from bridge.imds.document import STATUS_RANK
from bridge.shell.journal import Journal
from bridge.support.observability import RateLimitedLog

log = logging.getLogger("bridge.azure.tracker")

#: Contents remembered per event, the newest kept (an event's contents are its statuses and each
#: moved NotBefore: a handful). Past it, the oldest content seen again is news again (a duplicate).
MAX_CONTENTS = 16
#: Observations waiting for their commit, at most (a batch is at most a few hundred; only a disk
#: that refuses every commit could grow it, and then the oldest answers are dropped: duplicates).
MAX_PENDING = 50_000
_DIGEST = 8
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS events ("
    " key TEXT PRIMARY KEY, state TEXT NOT NULL, seen BLOB NOT NULL, seq INTEGER NOT NULL"
    ") WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS events_by_seq ON events (seq)",
)


@dataclass(frozen=True, slots=True)
class News:
    """An observation worth a record: the event's state after it, and whether it came late (an
    earlier status than one already seen)."""

    state: Status
    late: bool


class EventTracker:
    def __init__(
        self, max_events: int = 200_000, state_path: Path | None = None, *, legacy_path: Path | None = None
    ) -> None:
        self.max_events = max_events
        self.path = state_path
        #: Problems with the file, by kind (``corrupt``: moved aside at start; ``write``: a commit the
        #: disk refused; ``read``: a lookup that failed, answered as unknown): a metric.
        self.errors: dict[str, int] = {"corrupt": 0, "write": 0, "read": 0}
        self._lock = threading.Lock()
        # key -> (state, digests seen, whether the file holds the key): answered, not committed yet.
        self._pending: dict[str, tuple[Status, bytes, bool]] = {}
        # Rows of a commit the disk refused, their records already out: written with the next commit
        # (only the keys of a batch are committed with it, so a key not seen again stayed unwritten).
        self._failed: dict[str, tuple[Status, bytes, bool]] = {}
        self._read_errors = RateLimitedLog(log, every=60.0, level=logging.ERROR)  # per lookup: a flood
        self._db = self._open()
        self._count = int(self._db.execute("SELECT count(*) FROM events").fetchone()[0])
        self._seq = int(self._db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])
        if legacy_path is not None and legacy_path.exists():
            self._import(legacy_path)
        if self._count > self.max_events:  # a smaller cap than the file was kept with
            with self._db:
                self._count -= self._evict(self._count)

    def _import(self, legacy: Path) -> None:
        """The states an earlier version kept (``azure-states.jsonl``: key -> state, no contents),
        taken over once and the old file removed, so an upgrade does not move a state back."""
        states = [(k, v) for k, v in Journal(legacy).load().items() if v in _STATES]
        with self._lock:
            self._pending.update((key, (cast(Status, state), b"", False)) for key, state in states)
        try:
            self.persist_keys([key for key, _ in states])
            legacy.unlink()
        except OSError as exc:  # held in memory this run; the old file is read again at the next start
            log.error("event states of the previous version not taken over yet", extra={"error": str(exc)})
            return
        log.info("event states taken over from the previous version", extra={"events": len(states)})

    # -- the file -------------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        if self.path is None:
            return self._connect(":memory:")
        try:
            return self._connect(str(self.path))
        except sqlite3.DatabaseError as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            log.error(
                "the Azure channel's event states cannot be read; moved aside, starting over "
                "(events seen before may be published again, with the same recordId)",
                extra={"path": str(self.path), "aside": str(aside), "error": str(exc)},
            )
            self.errors["corrupt"] += 1
            for suffix in ("", "-wal", "-shm"):
                part = self.path.with_name(self.path.name + suffix)
                if part.exists():
                    part.replace(aside.with_name(aside.name + suffix))
            return self._connect(str(self.path))

    @staticmethod
    def _connect(where: str) -> sqlite3.Connection:
        # Autocommit off by hand (isolation_level=None): one explicit transaction per batch.
        db = sqlite3.connect(where, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a commit survives a power cut, as the outbox does
            db.execute("PRAGMA cache_size=-2048")  # 2 MiB of pages: memory does not grow with the file
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute("SELECT key, state, seen, seq FROM events LIMIT 1").fetchall()
            if where != ":memory:" and db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("quick_check failed")
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _known(self, key: str) -> tuple[Status, bytes, bool] | None:
        pending = self._pending.get(key)
        return pending if pending is not None else self._stored(key)

    def _stored(self, key: str) -> tuple[Status, bytes, bool] | None:
        """The event's committed row (None: unknown, or unreadable, counted and logged)."""
        try:
            row = self._db.execute("SELECT state, seen FROM events WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:  # answered as unknown: published again rather than lost
            self.errors["read"] += 1
            self._read_errors.log("cannot read an event's state (answered as news)", error=str(exc))
            return None
        if row is None or row[0] not in _STATES:
            return None
        return cast(Status, row[0]), bytes(row[1]), True

    def ended(self, key: str) -> bool:
        """Whether Azure's last committed word on the event (its records out) was ``Completed`` or
        ``Canceled``: the reconciliation asks it of an event it no longer holds, so a late word about
        an event whose findings are out starts nothing (it used to keep every such key in memory for
        an hour, ~200 B each: issue 33). Committed, not pending: an observation of the batch being
        stored is still in the reconciliation's hands."""
        with self._lock:
            # A commit the disk refused counts: its records are out. Unreadable: not ended (a finding
            # too many, never one lost).
            row = self._failed.get(key) or self._stored(key)
            return row is not None and row[0] in FINAL

    # -- the tracker ----------------------------------------------------------------------------------

    def observe(self, event: AzureEvent) -> News | None:
        """News, or None for a duplicate (the same content as before: a redelivery, a repeated row)."""
        digest = _digest(event)
        with self._lock:
            key = event.key
            known = self._known(key)
            state, seen, stored = known if known is not None else (event.event_status, b"", False)
            if any(seen[i : i + _DIGEST] == digest for i in range(0, len(seen), _DIGEST)):
                return None
            seen = (seen + digest)[-MAX_CONTENTS * _DIGEST :]
            late = STATUS_RANK[event.event_status] < STATUS_RANK[state]
            if not late:
                state = event.event_status
            self._pending.pop(key, None)
            self._pending[key] = (state, seen, stored)
            while len(self._pending) > MAX_PENDING:
                del self._pending[next(iter(self._pending))]
            return News(state, late)

    def forget(self, event: AzureEvent) -> None:
        """Undo :meth:`observe` for an observation whose records could not be stored, so it is news
        again when it is read again (the source was not committed): nothing is lost to a failure."""
        with self._lock:
            self._pending.pop(event.key, None)

    def persist(self, events: Iterable[AzureEvent]) -> None:
        """Commit what these observations left (their records are in the outbox now): one fsync.
        ``OSError`` when the disk refuses; the rows are written with the next commit."""
        self.persist_keys(event.key for event in events)

    def persist_keys(self, keys: Iterable[str]) -> None:
        with self._lock:
            rows = dict(self._failed)
            for key in keys:
                pending = self._pending.get(key)
                if pending is not None:
                    rows[key] = pending
            if not rows:
                return
            first = self._seq + 1
            added = sum(not stored for _, _, stored in rows.values())
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT INTO events (key, state, seen, seq) VALUES (?, ?, ?, ?) ON CONFLICT (key) "
                    "DO UPDATE SET state = excluded.state, seen = excluded.seen, seq = excluded.seq",
                    [(key, state, seen, first + n) for n, (key, (state, seen, _)) in enumerate(rows.items())],
                )
                forgotten = self._evict(self._count + added)  # in the same commit: one fsync a batch
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self.errors["write"] += 1
                self._failed = dict(list(rows.items())[-MAX_PENDING:])
                raise OSError(f"cannot keep the events' states: {exc}") from exc
            self._failed = {}
            self._seq = first + len(rows) - 1
            self._count += added - forgotten
            for key, row in rows.items():
                if self._pending.get(key) == row:
                    del self._pending[key]

    def _evict(self, count: int) -> int:
        """Forget the least recently changed events past ``max_events`` (of ``count`` held); how many."""
        excess = count - self.max_events
        if excess <= 0:
            return 0
        (last,) = self._db.execute(
            "SELECT seq FROM events ORDER BY seq LIMIT 1 OFFSET ?", (excess - 1,)
        ).fetchone()
        return int(self._db.execute("DELETE FROM events WHERE seq <= ?", (last,)).rowcount)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __len__(self) -> int:
        with self._lock:
            return self._count + sum(1 for _, _, stored in self._pending.values() if not stored)


def _digest(event: AzureEvent) -> bytes:
    return hashlib.blake2b(orjson.dumps(event.content), digest_size=_DIGEST).digest()


_STATES = frozenset(get_args(Status))
