"""The outbox: a durable, bounded, append-only queue with one cursor per sink.

Why it exists: a record must survive anything that can happen between "IMDS showed a change" and
"every destination confirmed it" (a broker outage, SIGKILL, the VM's own reboot, which is often the
very event being reported, a full or failing disk). So a record is appended and fsynced here
*before* any sink sees it, and it leaves only when every sink's cursor has moved past it (end-to-end
acknowledgement, as in Vector's pipelines).

Layout under ``<state-dir>/outbox/`` (directories 0700, files 0600)::

    seg-00000000000000000001.log    frames, oldest segment first (named by their first seq)
    seg-00000000000000000412.log    the active segment (appends go here; never deleted)
    cursors/<sink-id>               the last seq that sink confirmed, as text

Frames are described in :mod:`bridge.pipeline.frames`, the segment files handled by
:mod:`bridge.pipeline.segments`, the sinks' positions by :mod:`bridge.pipeline.cursors`. Records
are found through an **index of frame positions** (seq -> segment, offset, length), never by
arithmetic on seqs: recovery may drop damaged frames, so seqs can have gaps, and a reader asks for
"the next frame after seq N".

Faults, and what each costs:

* A **torn tail** (a crash mid-append) is cut off at recovery; that append never returned, so its
  record was never promised.
* A **damaged frame** (a flipped bit, a bad sector) is skipped, logged once with the seqs it covered
  and counted in ``se_bridge_outbox_corrupt_frames_total``; every intact frame after it is delivered
  in order. Reads check each frame's CRC again, so damage that appears while the service runs is
  caught the same way: no sink is ever handed a damaged record.
* A **short write, ENOSPC or EIO** while appending: the segment is truncated back to the last whole
  frame and :class:`OutboxWriteError` is raised: a frame is either whole and fsynced or absent. The
  producer keeps its change pending and records it when space returns.
* A **cursor that cannot be written** (ENOSPC, EMFILE): the sink's position moves on in memory and is
  written again with the next confirmation; a restart before that re-sends a few records (same ids).

Durability choices: appends are fsynced (a record must not be lost). A producer that finishes many
records at once (the approver's lane batch) may append with ``sync=False`` and call :meth:`Outbox.sync`
once before it acts on their durability (commits the source): one fsync per batch instead of one per
record, which is most of what a burst of decisions costs. Such frames are visible to sinks before they
are durable; a power loss in between can only re-send them (the producer re-creates them, same ids).
Cursor files are replaced
atomically but not fsynced: after a power loss a sink may be sent a few records again, which
at-least-once delivery with deterministic record ids allows, and it saves an fsync per delivery.
Every configured sink's cursor file is written when the sink is first seen, so a sink that has not
confirmed anything yet keeps its own position across restarts.

Bounds: ``max_records`` and ``max_bytes`` limit what is held for the slowest sink. At the limit
:meth:`Outbox.append` raises :class:`OutboxFull`; the producer then keeps its change pending, so when
room frees up it publishes one record that carries the net change (see ``docs/operations.md``).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from pathlib import Path

from bridge.pipeline.cursors import SinkCursors
from bridge.pipeline.entry import Entry, RecordMeta
from bridge.pipeline.frame_index import FrameIndex, Loc
from bridge.pipeline.metrics import PipelineMetrics
from bridge.pipeline.segments import DiskCalls, SegmentLog
from bridge.support.fsutil import DirectoryLocked, ensure_private_dir, lock_directory, lock_lost

log = logging.getLogger(__name__)

_SINK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")


class OutboxLocked(Exception):
    """Another process uses this outbox (two agents on one state directory would corrupt it)."""


class OutboxFull(Exception):
    """The outbox holds ``max_records`` records or ``max_bytes`` bytes for its slowest sink."""


class OutboxWriteError(OSError):
    """A record could not be made durable (disk full, I/O error); nothing of it was kept."""


class Outbox:
    """See the module docstring. Thread-safe: one appender, any number of sink readers.

    ``disk`` is the seam fault tests use to make writes short or failing (:class:`DiskCalls`)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        sink_ids: list[str],
        *,
        max_records: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
        segment_bytes: int = 1024 * 1024,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        if not sink_ids:
            raise ValueError("an outbox needs at least one sink")
        for sid in sink_ids:
            if not _SINK_ID.match(sid):
                raise ValueError(f"invalid sink id {sid!r}")
        self.dir = Path(directory)
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._metrics = metrics
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._sync_lock = threading.Lock()  # one fsync of a batch at a time, outside _lock
        self._index = FrameIndex()
        self._next_seq = 1
        self.disk = DiskCalls()
        ensure_private_dir(self.dir)
        self._segments = SegmentLog(
            self.dir, segment_bytes=segment_bytes, disk=self.disk, on_corrupt=self._count_corrupt
        )
        self._cursors = SinkCursors(self.dir / "cursors", sink_ids, metrics)
        try:
            self._lock_fd: int | None = lock_directory(self.dir)
        except DirectoryLocked as exc:
            raise OutboxLocked(str(exc)) from None
        self._recover()

    def _recover(self) -> None:
        locs = self._segments.scan()
        last_seq = locs[-1].seq if locs else 0
        firsts = self._segments.firsts
        self._next_seq = max(last_seq + 1, firsts[-1] if firsts else 1)
        self._cursors.recover(oldest=locs[0].seq - 1 if locs else self._next_seq - 1)
        # A seq is never given twice, even when the newest frames were cut off as damaged after a sink
        # had confirmed them: a sink's position stays meaningful and a seq names one record forever.
        self._next_seq = max(self._next_seq, self._cursors.highest() + 1)
        floor = self._cursors.floor()
        for loc in locs:
            if loc.seq > floor:
                self._index.add(loc)
        self._segments.trim(floor)
        self._segments.open_active(self._next_seq)
        self._publish_gauges()
        if locs:
            log.info(
                "outbox recovered",
                extra={"records": len(self._index), "bytes": self._index.bytes, "nextSeq": self._next_seq},
            )

    def _count_corrupt(self, frames_hit: int = 1) -> None:
        if self._metrics is not None:
            self._metrics.outbox_corrupt.inc(frames_hit)

    # -- appending ------------------------------------------------------------------------------

    def append(self, meta: RecordMeta, payload: bytes, *, sync: bool = True) -> Entry:
        """Make ``payload`` durable and visible to every sink.

        Raises :class:`OutboxFull` at the limits and :class:`OutboxWriteError` when the disk refused
        the frame; in both cases nothing was kept and the caller may try again later. ``sync=False``
        leaves the fsync to the caller's :meth:`sync` (see the module docstring)."""
        with self._lock:
            self._check_room(len(payload))
            seq, appended_ms = self._next_seq, int(time.time() * 1000)
            try:
                loc = self._segments.append(seq, appended_ms, meta, payload, sync)
            except OSError as err:
                raise self._write_failed(err) from None
            self._next_seq = seq + 1
            self._index.add(loc)
            self._changed.notify_all()
        self._publish_gauges()
        return Entry(seq, meta, appended_ms / 1000.0, payload)

    def _check_room(self, size: int) -> None:
        records, held = len(self._index), self._index.bytes
        if records >= self.max_records or held + size > self.max_bytes:
            raise OutboxFull(
                f"outbox holds {records} records / {held} bytes "
                f"(limits {self.max_records} / {self.max_bytes})"
            )

    def sync(self) -> None:
        """Make every frame appended so far durable. Raises :class:`OutboxWriteError` when the disk
        refuses; the frames stay readable, and the caller treats them as not durable (appends
        them again, with their ids, the durable way).

        The fsync runs outside the append lock, on a duplicate of the segment's descriptor (a roll
        meanwhile syncs and closes the original): the approver's lanes append and sync concurrently,
        and with the sync under the lock each lane's appends queued behind every other lane's fsync.
        Concurrent callers share one fsync: a caller whose frames an earlier fsync already covered
        returns at once (group commit)."""
        segments = self._segments
        with self._lock:
            upto = segments.unsynced_seq
            if upto <= segments.synced_seq:
                return
            try:
                fd = segments.dup_active()
            except OSError as err:  # EMFILE: the caller appends its frames again, durably
                raise self._write_failed(err) from None
            if fd is None:
                return
        try:
            with self._sync_lock:
                if segments.synced_seq >= upto:
                    return
                try:
                    segments.fsync(fd)
                except OSError as err:
                    raise self._write_failed(err) from None
                with self._lock:
                    segments.synced_seq = max(segments.synced_seq, upto)
        finally:
            os.close(fd)

    def _write_failed(self, err: OSError) -> OutboxWriteError:
        if self._metrics is not None:
            self._metrics.outbox_write_errors.labels("append").inc()
        reason = os.strerror(err.errno) if err.errno else str(err)
        return OutboxWriteError(err.errno or errno.EIO, f"cannot write the outbox: {reason}")

    # -- reading and acknowledging ---------------------------------------------------------------

    def cursor(self, sink_id: str) -> int:
        """The last seq ``sink_id`` confirmed."""
        return self._cursors[sink_id]

    def read(self, after: int, limit: int = 100) -> list[Entry]:
        """Up to ``limit`` intact entries with seq > ``after``, oldest first.

        A frame found damaged is reported once and taken out of the queue for every sink. An I/O error
        (EMFILE, EIO) is raised only when nothing could be read; the caller retries."""
        out: list[Entry] = []
        with self._lock:
            while len(out) < limit:
                position = self._index.after(out[-1].seq if out else after)
                got, damaged = self._segments.read_run(self._index.slice(position, limit - len(out)))
                out.extend(got)
                if not damaged:
                    break
                for loc in damaged:
                    self._drop_damaged(loc)
        return out

    def _drop_damaged(self, loc: Loc) -> None:
        self._index.remove(loc)
        self._count_corrupt()
        log.error(
            "outbox frame damaged on disk, skipped; the intact frames after it are delivered",
            extra={"seq": loc.seq, "segment": self._segments.path(loc.segment).name, "offset": loc.offset},
        )

    def wait(self, after: int, timeout: float | None) -> bool:
        """Block until an entry with seq > ``after`` exists (True) or ``timeout`` passes (False)."""
        with self._changed:
            if self._has_after(after):
                return True
            self._changed.wait(timeout)
            return self._has_after(after)

    def _has_after(self, seq: int) -> bool:
        last = self._index.last_seq()
        return last is not None and last > seq

    def wake(self) -> None:
        """Wake every waiting reader (used at shutdown)."""
        with self._changed:
            self._changed.notify_all()

    def ack(self, sink_id: str, seq: int) -> None:
        """``sink_id`` confirmed every entry up to ``seq``; trims what every sink has confirmed."""
        with self._lock:
            if not self._cursors.advance(sink_id, seq):
                return
            floor = self._cursors.floor()
            self._index.drop_through(floor)
            self._segments.trim(floor)
        # Written after the lock is let go: appends do not wait for a file replace per delivery.
        # A segment may already be gone while its cursor file still names an older seq; a restart
        # then starts at the oldest frame left, which every sink had confirmed anyway.
        self._cursors.save()
        self._publish_gauges()

    def oldest_unconfirmed(self, sink_id: str) -> float | None:
        """Unix time the oldest record ``sink_id`` has not confirmed became durable, if any."""
        with self._lock:
            loc = self._index.at(self._index.after(self._cursors[sink_id]))
            return None if loc is None else loc.appended_at

    def depth(self, sink_id: str) -> int:
        """Records ``sink_id`` has not confirmed (counted in the index: seqs may have gaps)."""
        with self._lock:
            return self._index.count_after(self._cursors[sink_id])

    def on_disk_after(self, seq: int) -> list[Entry]:
        """Every intact record still on disk with a seq above ``seq``, confirmed or not, oldest first.

        Used once at start-up (baseline recovery), so it simply reads the segments again."""
        with self._lock:
            return self._segments.entries_after(seq)

    @property
    def last_seq(self) -> int:
        """The seq of the newest record ever appended (0 when none)."""
        with self._lock:
            return self._next_seq - 1

    @property
    def pending(self) -> tuple[int, int]:
        """(records, bytes) held for the slowest sink."""
        with self._lock:
            return len(self._index), self._index.bytes

    def lock_lost(self) -> str | None:
        """Why this outbox's directory lock no longer guards it (the state directory was deleted),
        or None: :func:`bridge.support.fsutil.lock_lost`."""
        return lock_lost(self._lock_fd, self.dir)

    def close(self) -> None:
        self._cursors.save()
        with self._lock:
            self._segments.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the lock
                self._lock_fd = None

    def _publish_gauges(self) -> None:
        if self._metrics is not None:
            records, size = self.pending
            self._metrics.outbox_records.set(records)
            self._metrics.outbox_bytes.set(size)
