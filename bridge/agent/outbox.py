"""The outbox: a durable, bounded, append-only queue with one cursor per sink.

Why it exists: a record must survive anything that can happen between "IMDS showed a change" and
"every destination confirmed it" (a broker outage, SIGKILL, the VM's own reboot, which is often the
very event being reported). So a record is appended and fsynced here *before* any sink sees it, and
it leaves only when every sink's cursor has moved past it (end-to-end acknowledgement, as in
Vector's pipelines).

Layout under ``<state-dir>/outbox/``::

    seg-00000000000000000001.log    frames, oldest segment first (named by their first seq)
    seg-00000000000000000412.log    the active segment (appends go here; never deleted)
    cursors/<sink-id>               the last seq that sink confirmed, as text

A frame is one line: ``<seq> <recordId> <appendedAtMs> <crc32 hex> <length> <payload>\\n``. The
payload is a record as one line of JSON; the CRC and length detect a torn write at the tail (the
frame is cut off at recovery) or a corrupt frame (skipped, counted). Sinks read frames back from
disk, so a long outage costs disk, not memory.

Durability choices: appends are fsynced (a record must not be lost); cursor files are replaced
atomically but not fsynced: after a power loss a sink may be sent a few records again, which
at-least-once delivery with deterministic record ids allows, and it saves an fsync per delivery.

Bounds: ``max_records`` and ``max_bytes`` limit what is held for the slowest sink. At the limit
:meth:`Outbox.append` raises :class:`OutboxFull`; the agent then keeps its baseline document where
it was and keeps polling, so when room frees up it publishes one record that carries the net change
since the last admitted record. The newest state is never lost; intermediate documents seen while
full are (logged at error level and counted, see ``docs/operations.md``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from bridge.fsutil import datasync, sync_dir, write_atomic

log = logging.getLogger("bridge.outbox")

_SEGMENT = re.compile(r"^seg-(\d{20})\.log$")
_SINK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")


class OutboxLocked(Exception):
    """Another process uses this outbox (two agents on one state directory would corrupt it)."""


class OutboxFull(Exception):
    """The outbox holds ``max_records`` records or ``max_bytes`` bytes for its slowest sink."""


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    record_id: str
    appended_at: float  # Unix time the record became durable
    payload: bytes


@dataclass(frozen=True, slots=True)
class _Loc:
    seq: int
    segment: int  # first seq of the segment holding the frame
    offset: int  # of the payload inside the segment file
    length: int  # of the payload
    frame_bytes: int
    record_id: str
    appended_at: float


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
        metrics: object | None = None,
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
        self._index: deque[_Loc] = deque()  # frames some sink has not confirmed yet
        self._pending_bytes = 0
        self._segments: list[int] = []  # first seq of each segment file, ascending
        self._read_fds: dict[int, int] = {}
        self._last: Entry | None = None
        self._next_seq = 1
        self._append_fd: int | None = None
        self._active_size = 0
        self._cursors: dict[str, int] = {}
        (self.dir / "cursors").mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_directory(self.dir)
        self._recover(sink_ids)

    # -- recovery -------------------------------------------------------------------------------

    def _recover(self, sink_ids: list[str]) -> None:
        self._segments = sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := _SEGMENT.match(p.name)))
        frames: list[_Loc] = []
        for i, first in enumerate(self._segments):
            frames.extend(self._scan(first, is_last=i == len(self._segments) - 1))
        if frames:
            last = frames[-1]
            self._next_seq = last.seq + 1
            self._last = Entry(last.seq, last.record_id, last.appended_at, b"")
        elif self._segments:
            self._next_seq = self._segments[-1]
        saved = {sid: self._read_cursor(sid) for sid in sink_ids}
        known = [c for c in saved.values() if c is not None]
        # A sink seen for the first time starts where the slowest known sink is, or at the oldest
        # record on disk: it gets what is still held, never less than the others.
        default = min(known) if known else (frames[0].seq - 1 if frames else self._next_seq - 1)
        for sid in sink_ids:
            cursor = saved[sid] if saved[sid] is not None else default
            self._cursors[sid] = min(cursor, self._next_seq - 1)
        floor = min(self._cursors.values())
        for loc in frames:
            if loc.seq > floor:
                self._index.append(loc)
                self._pending_bytes += loc.frame_bytes
        if self._last is not None:
            self._last = self._load(self._last.seq, frames) or self._last
        self._trim_segments(floor)
        self._open_active()
        self._publish_gauges()
        if frames:
            log.info(
                "outbox recovered",
                extra={"records": len(self._index), "bytes": self._pending_bytes, "nextSeq": self._next_seq},
            )

    def _scan(self, first: int, is_last: bool) -> list[_Loc]:
        path = self._segment_path(first)
        out: list[_Loc] = []
        good_end = 0
        with open(path, "rb") as f:
            offset = 0
            for line in f:
                loc = _parse_frame(line, first, offset)
                offset += len(line)
                if loc is None:
                    if is_last and not line.endswith(b"\n"):
                        break  # torn tail of the active segment: cut it off below
                    self._count_corrupt()
                    log.error("outbox frame corrupt, skipped", extra={"segment": path.name, "offset": offset})
                    good_end = offset
                    continue
                out.append(loc)
                good_end = offset
        if is_last and good_end < path.stat().st_size:
            log.warning(
                "outbox tail torn by a crash, truncated", extra={"segment": path.name, "at": good_end}
            )
            self._count_corrupt()
            os.truncate(path, good_end)
        return out

    def _count_corrupt(self) -> None:
        if self._metrics is not None:
            self._metrics.outbox_corrupt.inc()

    def _load(self, seq: int, frames: list[_Loc]) -> Entry | None:
        for loc in reversed(frames):
            if loc.seq == seq:
                return Entry(loc.seq, loc.record_id, loc.appended_at, self._read_payload(loc))
        return None

    # -- appending ------------------------------------------------------------------------------

    def append(self, record_id: str, payload: bytes) -> Entry:
        """Make ``payload`` durable and visible to every sink. Raises :class:`OutboxFull`."""
        if b"\n" in payload or " " in record_id:
            raise ValueError("payload must be one line and record id must not contain spaces")
        with self._lock:
            if len(self._index) >= self.max_records or self._pending_bytes + len(payload) > self.max_bytes:
                raise OutboxFull(
                    f"outbox holds {len(self._index)} records / {self._pending_bytes} bytes "
                    f"(limits {self.max_records} / {self.max_bytes})"
                )
            if self._active_size >= self.segment_bytes:
                self._roll()
            seq = self._next_seq
            now = time.time()
            header = b"%d %s %d %08x %d " % (
                seq,
                record_id.encode(),
                int(now * 1000),
                zlib.crc32(payload),
                len(payload),
            )
            frame = header + payload + b"\n"
            assert self._append_fd is not None
            os.write(self._append_fd, frame)
            datasync(self._append_fd)
            loc = _Loc(
                seq,
                self._segments[-1],
                self._active_size + len(header),
                len(payload),
                len(frame),
                record_id,
                now,
            )
            self._active_size += len(frame)
            self._next_seq = seq + 1
            self._index.append(loc)
            self._pending_bytes += len(frame)
            entry = Entry(seq, record_id, now, payload)
            self._last = entry
            self._changed.notify_all()
        self._publish_gauges()
        return entry

    def _open_active(self) -> None:
        if not self._segments:
            self._segments.append(self._next_seq)
        path = self._segment_path(self._segments[-1])
        created = not path.exists()
        self._append_fd = os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600
        )
        self._active_size = os.fstat(self._append_fd).st_size
        if created:
            sync_dir(self.dir)

    def _roll(self) -> None:
        assert self._append_fd is not None
        os.close(self._append_fd)
        self._segments.append(self._next_seq)
        self._open_active()

    # -- reading and acknowledging ---------------------------------------------------------------

    def cursor(self, sink_id: str) -> int:
        """The last seq ``sink_id`` confirmed."""
        with self._lock:
            return self._cursors[sink_id]

    def read(self, after: int, limit: int = 100) -> list[Entry]:
        """Up to ``limit`` entries with seq > ``after``, oldest first."""
        with self._lock:
            if not self._index or self._index[-1].seq <= after:
                return []
            start = max(0, after + 1 - self._index[0].seq)
            out = []
            for i in range(start, min(len(self._index), start + limit)):
                loc = self._index[i]
                out.append(Entry(loc.seq, loc.record_id, loc.appended_at, self._read_payload(loc)))
            return out

    def wait(self, after: int, timeout: float | None) -> bool:
        """Block until an entry with seq > ``after`` exists (True) or ``timeout`` passes (False)."""
        with self._changed:
            if self._next_seq - 1 > after:
                return True
            self._changed.wait(timeout)
            return self._next_seq - 1 > after

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
            write_atomic(self.dir / "cursors" / sink_id, b"%d\n" % seq, durable=False)
            floor = min(self._cursors.values())
            while self._index and self._index[0].seq <= floor:
                self._pending_bytes -= self._index.popleft().frame_bytes
            self._trim_segments(floor)
        self._publish_gauges()

    def oldest_unconfirmed(self, sink_id: str) -> float | None:
        """Unix time the oldest record ``sink_id`` has not confirmed became durable, if any."""
        with self._lock:
            cursor = self._cursors[sink_id]
            if not self._index or self._index[-1].seq <= cursor:
                return None
            return self._index[max(0, cursor + 1 - self._index[0].seq)].appended_at

    def depth(self, sink_id: str) -> int:
        with self._lock:
            return self._next_seq - 1 - self._cursors[sink_id]

    def on_disk_after(self, seq: int) -> list[Entry]:
        """Every record still on disk with a seq above ``seq``, confirmed or not, oldest first.

        Used once at start-up (baseline recovery), so it simply reads the segments again."""
        with self._lock:
            out: list[Entry] = []
            for first in self._segments:
                with open(self._segment_path(first), "rb") as f:
                    offset = 0
                    for line in f:
                        loc = _parse_frame(line, first, offset)
                        offset += len(line)
                        if loc is not None and loc.seq > seq:
                            out.append(
                                Entry(loc.seq, loc.record_id, loc.appended_at, self._read_payload(loc))
                            )
            return out

    def last(self) -> Entry | None:
        """The newest record ever appended that is still on disk (confirmed or not)."""
        with self._lock:
            return self._last

    @property
    def pending(self) -> tuple[int, int]:
        """(records, bytes) held for the slowest sink."""
        with self._lock:
            return len(self._index), self._pending_bytes

    def close(self) -> None:
        with self._lock:
            if self._append_fd is not None:
                os.close(self._append_fd)
                self._append_fd = None
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the lock
                self._lock_fd = None

    # -- internals --------------------------------------------------------------------------------

    def _read_payload(self, loc: _Loc) -> bytes:
        fd = self._read_fds.get(loc.segment)
        if fd is None:
            fd = os.open(self._segment_path(loc.segment), os.O_RDONLY | getattr(os, "O_BINARY", 0))
            self._read_fds[loc.segment] = fd
        return os.pread(fd, loc.length, loc.offset)

    def _trim_segments(self, floor: int) -> None:
        # A segment can go once every frame in it is confirmed by every sink; the active (last)
        # segment always stays, so the newest record and the next seq survive a restart.
        while len(self._segments) > 1 and self._segments[1] - 1 <= floor:
            first = self._segments.pop(0)
            fd = self._read_fds.pop(first, None)
            if fd is not None:
                os.close(fd)
            self._segment_path(first).unlink(missing_ok=True)

    def _read_cursor(self, sink_id: str) -> int | None:
        try:
            return int((self.dir / "cursors" / sink_id).read_text().strip())
        except FileNotFoundError:
            return None
        except ValueError:
            log.error("unreadable cursor file, sink starts from the oldest record", extra={"sink": sink_id})
            return None

    def _segment_path(self, first: int) -> Path:
        return self.dir / f"seg-{first:020d}.log"

    def _publish_gauges(self) -> None:
        if self._metrics is not None:
            records, size = self.pending
            self._metrics.outbox_records.set(records)
            self._metrics.outbox_bytes.set(size)


def _lock_directory(directory: Path) -> int | None:
    """Hold an exclusive lock on the outbox for the life of the process (released by the kernel on
    exit, even after SIGKILL). POSIX only; on Windows the service manager runs one instance."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise OutboxLocked(
            f"{directory} is in use by another process (one agent or approver per state directory)"
        ) from None
    return fd


def _parse_frame(line: bytes, segment: int, offset: int) -> _Loc | None:
    if not line.endswith(b"\n"):
        return None
    parts = line.split(b" ", 5)
    if len(parts) != 6:
        return None
    try:
        seq, rid, ts, crc, length = (
            int(parts[0]),
            parts[1].decode(),
            int(parts[2]),
            int(parts[3], 16),
            int(parts[4]),
        )
    except (ValueError, UnicodeDecodeError):
        return None
    payload = parts[5][:-1]
    if len(payload) != length or zlib.crc32(payload) != crc:
        return None
    header_len = len(line) - len(parts[5])
    return _Loc(seq, segment, offset + header_len, length, len(line), rid, ts / 1000.0)
