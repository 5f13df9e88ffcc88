"""The segment files of an outbox: frames appended whole or not at all, read back in runs, deleted
once every sink confirmed them.

Why a class of its own: this is where the outbox meets the disk, and where every file-level fault is
handled (a torn tail cut off at recovery, a short write or ENOSPC cut back to the last whole frame, a
roll that cannot open its new file leaving everything as it was, damage found when reading). The
:class:`~bridge.pipeline.outbox.Outbox` decides *what* is held (seqs, bounds, sink cursors); this
decides *how* it sits on disk. The two system calls a fault test replaces are one typed seam,
:class:`DiskCalls`; the real-disk tests use a full tmpfs instead.

Not thread-safe: the outbox calls every method under its lock, except :meth:`SegmentLog.fsync` on a
descriptor :meth:`SegmentLog.dup_active` gave it (the group commit runs outside the lock).
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bridge.pipeline import frames
from bridge.pipeline.entry import Entry, RecordMeta
from bridge.pipeline.frame_index import Loc, run_end
from bridge.support.fsutil import datasync, sync_dir

log = logging.getLogger("bridge.pipeline.outbox")  # one logger name for the outbox's lines

_SEGMENT = re.compile(r"^seg-(\d{20})\.log$")
_O_BINARY = getattr(os, "O_BINARY", 0)


@dataclass
class DiskCalls:
    """The system calls that write and fsync segment frames. Tests replace them to produce short
    writes, ENOSPC and EIO on demand; production never does."""

    write: Callable[[int, bytes | memoryview], int] = os.write
    sync: Callable[[int], None] = datasync


class SegmentLog:
    """The outbox's segment files, oldest first; the last one is active (appends go there)."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int,
        disk: DiskCalls,
        on_corrupt: Callable[[int], None],
    ) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.disk = disk
        self._on_corrupt = on_corrupt
        self.firsts: list[int] = []  # first seq of each segment file, ascending
        self._read_fds: dict[int, int] = {}
        self._append_fd: int | None = None
        self._active_size = 0
        self._tail_dirty = False  # a failed append left bytes past _active_size that are not cut yet
        # Frames appended with sync=False wait for a sync: every seq up to synced_seq is durable,
        # unsynced_seq is the newest one appended without an fsync.
        self.unsynced_seq = 0
        self.synced_seq = 0

    # -- recovery -------------------------------------------------------------------------------

    def scan(self) -> list[Loc]:
        """Every intact frame on disk, oldest first; damage is reported (and counted) once."""
        self.firsts = sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := _SEGMENT.match(p.name)))
        locs: list[Loc] = []
        for i, first in enumerate(self.firsts):
            following = self.firsts[i + 1] if i + 1 < len(self.firsts) else None
            locs.extend(self._scan_segment(first, following))
        return locs

    def _scan_segment(self, first: int, following: int | None) -> list[Loc]:
        """The intact frames of one segment; damage is reported, and cut off at the end of the active
        segment (``following`` is None), where it can only be a torn append."""
        path = self.path(first)
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
        self._on_corrupt(frames_hit)
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

    def open_active(self, next_seq: int) -> None:
        """Open the newest segment for appending (a new one named ``next_seq`` when there is none)."""
        if not self.firsts:
            self.firsts.append(next_seq)
        self._append_fd, self._active_size = self._open_segment(self.firsts[-1])

    # -- appending ------------------------------------------------------------------------------

    def append(self, seq: int, appended_ms: int, meta: RecordMeta, payload: bytes, sync: bool) -> Loc:
        """Write one whole frame (and fsync it unless ``sync`` is false). Raises :class:`OSError`
        with nothing of the frame kept: a short write is cut back to the last whole frame."""
        self._repair_tail()
        if self._active_size >= self.segment_bytes:
            self._roll(seq)
        start = self._active_size
        frame, loc = frames.encode(self.firsts[-1], start, seq, appended_ms, meta, payload)
        try:
            self._write_frame(frame, seq, sync)
        except OSError:
            self._cut_back(start)
            raise
        if not sync:
            self.unsynced_seq = seq
        self._active_size += len(frame)
        return loc

    def _write_frame(self, frame: bytes, seq: int, sync: bool) -> None:
        """Write all of ``frame`` and fsync it (unless ``sync`` is false); a short write is continued,
        a write of 0 is ENOSPC. A durable append also covers earlier unsynced frames."""
        assert self._append_fd is not None
        view = memoryview(frame)
        while view:
            written = self.disk.write(self._append_fd, view)
            if written <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[written:]
        if sync:
            self.disk.sync(self._append_fd)
            self.synced_seq = seq

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
        self.disk.sync(self._append_fd)
        self._tail_dirty = False

    def _open_segment(self, first: int) -> tuple[int, int]:
        path = self.path(first)
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

    def _roll(self, next_seq: int) -> None:
        """Start a new segment at ``next_seq``. The new file is opened before the old one is let go,
        so a failure (no inode, EMFILE) leaves the outbox exactly as it was."""
        fd, size = self._open_segment(next_seq)
        assert self._append_fd is not None
        if self.unsynced_seq > self.synced_seq:  # a batch's frames keep their fsync across the roll
            try:
                self.disk.sync(self._append_fd)
            except OSError:
                os.close(fd)
                raise
            self.synced_seq = next_seq - 1
        os.close(self._append_fd)
        self.firsts.append(next_seq)
        self._append_fd, self._active_size = fd, size

    # -- syncing a batch ------------------------------------------------------------------------

    def dup_active(self) -> int | None:
        """A duplicate of the active segment's descriptor, to fsync outside the outbox's lock (a roll
        meanwhile syncs and closes the original). Raises :class:`OSError` (EMFILE)."""
        return None if self._append_fd is None else os.dup(self._append_fd)

    def fsync(self, fd: int) -> None:
        self.disk.sync(fd)

    # -- reading --------------------------------------------------------------------------------

    def read_run(self, locs: list[Loc]) -> tuple[list[Entry], list[Loc]]:
        """Read the frames at ``locs``: each run of adjacent frames of one segment with a single
        ``pread`` (a backlog is read in big pieces), each frame checked on its own. An I/O error is
        raised only when nothing could be read."""
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
            fd = os.open(self.path(segment), os.O_RDONLY | _O_BINARY)
            self._read_fds[segment] = fd
        return fd

    def entries_after(self, seq: int) -> list[Entry]:
        """Every intact record on disk with a seq above ``seq``, read from the files again."""
        out: list[Entry] = []
        for first in self.firsts:
            buf = self.path(first).read_bytes()
            found, _ = frames.scan(buf)
            out.extend(frames.decode(buf, f) for f in found if f.seq > seq)
        return out

    # -- trimming and closing -------------------------------------------------------------------

    def trim(self, floor: int) -> None:
        """Delete the segments whose every frame has a seq <= ``floor``. The active (last) segment
        always stays, so the newest record and the next seq survive a restart."""
        while len(self.firsts) > 1 and self.firsts[1] - 1 <= floor:
            first = self.firsts.pop(0)
            fd = self._read_fds.pop(first, None)
            if fd is not None:
                os.close(fd)
            try:
                self.path(first).unlink(missing_ok=True)
            except OSError as err:  # retried by the next start's recovery; its frames are confirmed
                log.warning("cannot delete a confirmed outbox segment", extra={"error": str(err)})

    def close(self) -> None:
        """fsync what a batch left unsynced, and close every descriptor."""
        if self._append_fd is not None:
            if self.unsynced_seq > self.synced_seq:
                try:
                    self.disk.sync(self._append_fd)
                except OSError as err:
                    log.error("outbox frames could not be synced at close", extra={"error": str(err)})
            os.close(self._append_fd)
            self._append_fd = None
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    def path(self, first: int) -> Path:
        return self.dir / f"seg-{first:020d}.log"
