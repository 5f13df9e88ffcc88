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

Frames are described in :mod:`bridge.pipeline.frames`. Records are found through an **index of
frame positions** (seq -> segment, offset, length), never by arithmetic on seqs: recovery may drop
damaged frames, so seqs can have gaps, and a reader asks for "the next frame after seq N".

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
from collections.abc import Callable
from pathlib import Path

from bridge.pipeline import frames
from bridge.pipeline.entry import Entry, RecordMeta
from bridge.pipeline.frame_index import FrameIndex, Loc, run_end
from bridge.pipeline.metrics import PipelineMetrics
from bridge.support.fsutil import (
    DirectoryLocked,
    datasync,
    ensure_private_dir,
    lock_directory,
    lock_lost,
    sync_dir,
    write_atomic,
)
from bridge.support.observability import ErrorStreak

log = logging.getLogger(__name__)

_SEGMENT = re.compile(r"^seg-(\d{20})\.log$")
_SINK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")
_O_BINARY = getattr(os, "O_BINARY", 0)


class OutboxLocked(Exception):
    """Another process uses this outbox (two agents on one state directory would corrupt it)."""


class OutboxFull(Exception):
    """The outbox holds ``max_records`` records or ``max_bytes`` bytes for its slowest sink."""


class OutboxWriteError(OSError):
    """A record could not be made durable (disk full, I/O error); nothing of it was kept."""


class Outbox:
    """See the module docstring. Thread-safe: one appender, any number of sink readers."""

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
        self.segment_bytes = segment_bytes
        self._metrics = metrics
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._index = FrameIndex()
        self._segments: list[int] = []  # first seq of each segment file, ascending
        self._read_fds: dict[int, int] = {}
        self._next_seq = 1
        self._append_fd: int | None = None
        self._active_size = 0
        self._tail_dirty = False  # a failed append left bytes past _active_size that are not cut yet
        # Frames appended with sync=False wait for a sync: every seq up to _synced_seq is durable,
        # _unsynced_seq is the newest one appended without an fsync.
        self._unsynced_seq = 0
        self._synced_seq = 0
        self._sync_lock = threading.Lock()  # one fsync of a batch at a time, outside _lock
        self._cursor_lock = threading.Lock()  # cursor files are written outside _lock
        self._cursors: dict[str, int] = {}
        self._cursor_paths = {sid: self.dir / "cursors" / sid for sid in sink_ids}
        self._unsaved_cursors: set[str] = set()
        self._cursor_streak = ErrorStreak(log, "saving sink cursors")
        # Fault-injection seams (tests replace them to produce short writes and ENOSPC); the real-disk
        # tests use a full tmpfs instead.
        self._write: Callable[[int, bytes | memoryview], int] = os.write
        self._sync: Callable[[int], None] = datasync
        ensure_private_dir(self.dir)
        ensure_private_dir(self.dir / "cursors")
        try:
            self._lock_fd = lock_directory(self.dir)
        except DirectoryLocked as exc:
            raise OutboxLocked(str(exc)) from None
        self._recover(sink_ids)

    # -- recovery -------------------------------------------------------------------------------

    def _recover(self, sink_ids: list[str]) -> None:
        self._segments = sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := _SEGMENT.match(p.name)))
        locs: list[Loc] = []
        for i, first in enumerate(self._segments):
            following = self._segments[i + 1] if i + 1 < len(self._segments) else None
            locs.extend(self._scan_segment(first, following))
        last_seq = locs[-1].seq if locs else 0
        self._next_seq = max(last_seq + 1, self._segments[-1] if self._segments else 1)
        self._recover_cursors(sink_ids, locs)
        # A seq is never given twice, even when the newest frames were cut off as damaged after a sink
        # had confirmed them: a sink's position stays meaningful and a seq names one record forever.
        self._next_seq = max(self._next_seq, max(self._cursors.values()) + 1)
        floor = min(self._cursors.values())
        for loc in locs:
            if loc.seq > floor:
                self._index.add(loc)
        self._trim_segments(floor)
        self._open_active()
        self._publish_gauges()
        if locs:
            log.info(
                "outbox recovered",
                extra={"records": len(self._index), "bytes": self._index.bytes, "nextSeq": self._next_seq},
            )

    def _recover_cursors(self, sink_ids: list[str], locs: list[Loc]) -> None:
        """Each sink's saved position; a sink seen for the first time starts where the slowest known
        sink is (what the outbox still holds for it), or at the oldest record on disk, and its cursor
        file is written at once so it never borrows another sink's position after a restart."""
        saved = {sid: self._read_cursor(sid) for sid in sink_ids}
        known = [c for c in saved.values() if c is not None]
        oldest = locs[0].seq - 1 if locs else self._next_seq - 1
        start = min(known) if known else oldest
        for sid in sink_ids:
            cursor = saved[sid]
            if cursor is None:
                log.info("new sink starts with what the outbox holds", extra={"sink": sid, "after": start})
                cursor = start
                self._unsaved_cursors.add(sid)
            self._cursors[sid] = cursor
        self._save_cursors()

    def _scan_segment(self, first: int, following: int | None) -> list[Loc]:
        """The intact frames of one segment; damage is reported, and cut off at the end of the active
        segment (``following`` is None), where it can only be a torn append."""
        path = self._segment_path(first)
        buf = path.read_bytes()
        locs, damage = frames.scan(buf, first)
        for region in damage:
            at_tail = following is None and region.end == len(buf)
            self._report_damage(path, region, locs, (first - 1, following), at_tail)
        if following is None and damage and damage[-1].end == len(buf):
            os.truncate(path, damage[-1].start)
        return locs

    def _report_damage(
        self,
        path: Path,
        region: frames.Damage,
        locs: list[Loc],
        bounds: tuple[int, int | None],
        at_tail: bool,
    ) -> None:
        """Log a damaged region once, naming the seqs it held, and count the frames it cost. The seqs
        are those between the intact frames around it (or the segment's bounds: a segment is named
        by its first seq, the next one by the seq after its last)."""
        before = max((loc.seq for loc in locs if loc.offset < region.start), default=bounds[0])
        after = min((loc.seq for loc in locs if loc.offset >= region.end), default=bounds[1])
        lost = after - before - 1 if after is not None else 0
        frames_hit = max(1, lost, region.markers)
        self._count_corrupt(frames_hit)
        detail: dict[str, object] = {
            "segment": path.name,
            "offset": region.start,
            "bytes": region.end - region.start,
            "frames": frames_hit,
        }
        if lost and after is not None:
            detail["seqs"] = f"{before + 1}-{after - 1}" if lost > 1 else str(before + 1)
        else:
            detail.update(afterSeq=before, beforeSeq=after)
        if at_tail:
            log.warning("outbox tail torn by a crash or a failed write, cut off", extra=detail)
        else:
            log.error("outbox frames damaged, skipped; the intact frames after them are kept", extra=detail)

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
            try:
                self._repair_tail()
                if self._active_size >= self.segment_bytes:
                    self._roll()
            except OSError as err:
                raise self._write_failed(err) from None
            seq, now = self._next_seq, time.time()
            appended_ms = int(now * 1000)
            start = self._active_size
            frame, loc = frames.encode(self._segments[-1], start, seq, appended_ms, meta, payload)
            try:
                self._write_frame(frame, sync)
            except OSError as err:
                self._cut_back(start)
                raise self._write_failed(err) from None
            if not sync:
                self._unsynced_seq = seq
            self._active_size += len(frame)
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
        with self._lock:
            upto = self._unsynced_seq
            if upto <= self._synced_seq or self._append_fd is None:
                return
            try:
                fd = os.dup(self._append_fd)
            except OSError as err:  # EMFILE: the caller appends its frames again, durably
                raise self._write_failed(err) from None
        try:
            with self._sync_lock:
                if self._synced_seq >= upto:
                    return
                try:
                    self._sync(fd)
                except OSError as err:
                    raise self._write_failed(err) from None
                with self._lock:
                    self._synced_seq = max(self._synced_seq, upto)
        finally:
            os.close(fd)

    def _mark_synced(self) -> None:
        """An fsync of the active segment just covered every frame appended so far."""
        self._synced_seq = max(self._synced_seq, self._next_seq - 1)

    def _write_frame(self, frame: bytes, sync: bool = True) -> None:
        """Write all of ``frame`` and fsync it (unless ``sync`` is false); a short write is continued,
        a write of 0 is ENOSPC. A durable append also covers earlier unsynced frames."""
        assert self._append_fd is not None
        view = memoryview(frame)
        while view:
            written = self._write(self._append_fd, view)
            if written <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[written:]
        if sync:
            self._sync(self._append_fd)
            self._synced_seq = self._next_seq  # this frame's seq (counted up after the write)

    def _cut_back(self, size: int) -> None:
        """Truncate the active segment to ``size`` (the end of the last whole frame)."""
        self._tail_dirty = True
        try:
            self._repair_tail(size)
        except OSError as err:  # tried again before the next append; recovery would cut it too
            log.error("cannot cut a failed append off the outbox yet", extra={"error": str(err)})

    def _repair_tail(self, size: int | None = None) -> None:
        if not self._tail_dirty:
            return
        assert self._append_fd is not None
        size = self._active_size if size is None else size
        os.ftruncate(self._append_fd, size)
        self._sync(self._append_fd)
        self._tail_dirty = False

    def _write_failed(self, err: OSError) -> OutboxWriteError:
        if self._metrics is not None:
            self._metrics.outbox_write_errors.labels("append").inc()
        reason = os.strerror(err.errno) if err.errno else str(err)
        return OutboxWriteError(err.errno or errno.EIO, f"cannot write the outbox: {reason}")

    def _open_active(self) -> None:
        if not self._segments:
            self._segments.append(self._next_seq)
        self._append_fd, self._active_size = self._open_segment(self._segments[-1])

    def _open_segment(self, first: int) -> tuple[int, int]:
        path = self._segment_path(first)
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_BINARY, 0o600)
        try:
            size = os.fstat(fd).st_size
            if created:
                sync_dir(self.dir)
        except OSError:
            os.close(fd)
            raise
        return fd, size

    def _roll(self) -> None:
        """Start a new segment. The new file is opened before the old one is let go, so a failure
        (no inode, EMFILE) leaves the outbox exactly as it was."""
        fd, size = self._open_segment(self._next_seq)
        assert self._append_fd is not None
        if self._unsynced_seq > self._synced_seq:  # a batch's frames keep their fsync across the roll
            try:
                self._sync(self._append_fd)
            except OSError:
                os.close(fd)
                raise
            self._mark_synced()
        os.close(self._append_fd)
        self._segments.append(self._next_seq)
        self._append_fd, self._active_size = fd, size

    # -- reading and acknowledging ---------------------------------------------------------------

    def cursor(self, sink_id: str) -> int:
        """The last seq ``sink_id`` confirmed."""
        with self._lock:
            return self._cursors[sink_id]

    def read(self, after: int, limit: int = 100) -> list[Entry]:
        """Up to ``limit`` intact entries with seq > ``after``, oldest first.

        A frame found damaged is reported once and taken out of the queue for every sink. An I/O error
        (EMFILE, EIO) is raised only when nothing could be read; the caller retries."""
        out: list[Entry] = []
        with self._lock:
            while len(out) < limit:
                got, damaged = self._read_run(
                    self._index.after(out[-1].seq if out else after), limit - len(out)
                )
                out.extend(got)
                if not damaged:
                    break
                for loc in damaged:
                    self._drop_damaged(loc)
        return out

    def _read_run(self, position: int, limit: int) -> tuple[list[Entry], list[Loc]]:
        """Read the frames from ``position`` on: each run of adjacent frames of one segment with a
        single ``pread`` (a backlog is read in big pieces), each frame checked on its own."""
        locs = self._index.slice(position, limit)
        out: list[Entry] = []
        damaged: list[Loc] = []
        start = 0
        while start < len(locs):
            end = run_end(locs, start)
            first, last = locs[start], locs[end - 1]
            try:
                data = os.pread(
                    self._read_fd(first.segment), last.offset + last.length - first.offset, first.offset
                )
            except OSError:
                if out:
                    break
                raise
            base = first.offset
            for loc in locs[start:end]:
                entry = frames.read_indexed(data, loc.offset - base, loc)
                if entry is None:
                    damaged.append(loc)
                else:
                    out.append(entry)
            start = end
        return out, damaged

    def _read_fd(self, segment: int) -> int:
        fd = self._read_fds.get(segment)
        if fd is None:
            fd = os.open(self._segment_path(segment), os.O_RDONLY | _O_BINARY)
            self._read_fds[segment] = fd
        return fd

    def _drop_damaged(self, loc: Loc) -> None:
        self._index.remove(loc)
        self._count_corrupt()
        log.error(
            "outbox frame damaged on disk, skipped; the intact frames after it are delivered",
            extra={"seq": loc.seq, "segment": self._segment_path(loc.segment).name, "offset": loc.offset},
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
            if seq <= self._cursors[sink_id]:
                return
            self._cursors[sink_id] = seq
            self._unsaved_cursors.add(sink_id)
            floor = min(self._cursors.values())
            self._index.drop_through(floor)
            self._trim_segments(floor)
        # Written after the lock is let go: appends do not wait for a file replace per delivery.
        # A segment may already be gone while its cursor file still names an older seq; a restart
        # then starts at the oldest frame left, which every sink had confirmed anyway.
        self._save_cursors()
        self._publish_gauges()

    def _save_cursors(self) -> None:
        """Write the cursors not yet on disk; one that fails stays pending for the next call. Called
        without ``_lock``; ``_cursor_lock`` keeps the writes in order (a newer value never replaced
        by an older one)."""
        with self._cursor_lock:
            with self._lock:
                pending = {sid: self._cursors[sid] for sid in self._unsaved_cursors}
                self._unsaved_cursors.clear()
            for sid, value in list(pending.items()):
                try:
                    write_atomic(self._cursor_paths[sid], b"%d\n" % value, durable=False)
                except OSError as err:
                    with self._lock:
                        self._unsaved_cursors.update(pending)
                    if self._metrics is not None:
                        self._metrics.outbox_write_errors.labels("cursor").inc()
                    self._cursor_streak.failure(err.__class__.__name__, f"{sid}: {err}", sink=sid)
                    return
                del pending[sid]
            self._cursor_streak.success()

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
            out: list[Entry] = []
            for first in self._segments:
                buf = self._segment_path(first).read_bytes()
                found, _ = frames.scan(buf)
                out.extend(frames.decode(buf, f) for f in found if f.seq > seq)
            return out

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
        self._save_cursors()
        with self._lock:
            if self._append_fd is not None:
                if self._unsynced_seq > self._synced_seq:
                    try:
                        self._sync(self._append_fd)
                    except OSError as err:
                        log.error("outbox frames could not be synced at close", extra={"error": str(err)})
                os.close(self._append_fd)
                self._append_fd = None
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the lock
                self._lock_fd = None

    # -- internals --------------------------------------------------------------------------------

    def _trim_segments(self, floor: int) -> None:
        # A segment can go once every frame in it is confirmed by every sink; the active (last)
        # segment always stays, so the newest record and the next seq survive a restart.
        while len(self._segments) > 1 and self._segments[1] - 1 <= floor:
            first = self._segments.pop(0)
            fd = self._read_fds.pop(first, None)
            if fd is not None:
                os.close(fd)
            try:
                self._segment_path(first).unlink(missing_ok=True)
            except OSError as err:  # retried by the next start's recovery; its frames are confirmed
                log.warning("cannot delete a confirmed outbox segment", extra={"error": str(err)})

    def _read_cursor(self, sink_id: str) -> int | None:
        try:
            text = self._cursor_paths[sink_id].read_text().strip()
        except FileNotFoundError:
            return None
        if text.isascii() and text.isdigit():
            return int(text)
        log.error("unreadable cursor file, sink starts from the oldest record", extra={"sink": sink_id})
        return 0

    def _segment_path(self, first: int) -> Path:
        return self.dir / f"seg-{first:020d}.log"

    def _publish_gauges(self) -> None:
        if self._metrics is not None:
            records, size = self.pending
            self._metrics.outbox_records.set(records)
            self._metrics.outbox_bytes.set(size)
