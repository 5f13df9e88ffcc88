"""``file:///path.jsonl``: decisions from a JSON Lines file, followed as it grows.

For a lab, a test or an operator who writes decisions by hand: no broker needed. The position of a
message is its line number; the last committed line is kept in the state directory (written
atomically), so a restarted approver resumes after it. A last line without its newline is a writer
caught mid-line and is read once complete.

A waiting poll sleeps on inotify (``inotify_simple``, Linux): a decision is read the moment it is
written, where checking the file every 50 ms made it wait 25 ms on average and 50 at worst, a fifth
of an approval's whole budget (issue 19 item 4), and woke the approver 20 times a second for
nothing. inotify does not see what another host writes to a network filesystem, so the file is
also checked every :data:`SAFETY_NET` seconds; where inotify is missing (not Linux, no watch left)
the file is checked every :data:`CHECK_EVERY` seconds, as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from bridge.approver.sources.base import DecisionSource, Message, Position
from bridge.fsutil import ensure_private_dir, write_atomic

log = logging.getLogger(__name__)

#: Without inotify: how often a waiting poll checks whether the file grew (a ``stat``).
CHECK_EVERY = 0.05
#: With inotify: how often the file is checked anyway, for writes inotify does not report.
SAFETY_NET = 0.5


def _watch(directory: Path) -> Any:
    """An inotify instance watching ``directory`` for writes, creations and renames; None where there
    is none to be had (not Linux, no descriptor or inotify instance left, no such directory yet,
    ``fs.inotify.max_user_watches`` reached)."""
    try:
        from inotify_simple import INotify, flags
    except ImportError:  # not Linux: the dependency is Linux-only
        return None
    inotify = None
    try:
        inotify = INotify()
        inotify.add_watch(directory, flags.MODIFY | flags.CLOSE_WRITE | flags.CREATE | flags.MOVED_TO)
        return inotify
    except OSError as exc:
        if inotify is not None:
            inotify.close()
        log.warning("inotify unavailable; checking the decisions file every 50 ms", extra={"error": str(exc)})
        return None


class _Writes:
    """Waits for a write to one file: inotify on its directory (which also reports the file created
    or renamed into place after the watch began), or a plain sleep where inotify is not to be had."""

    def __init__(self, path: Path) -> None:
        self._name = path.name
        self._inotify = _watch(path.parent)

    def wait(self, timeout: float) -> None:
        """Return once the file may have changed, or after ``timeout`` seconds at most."""
        if self._inotify is None:
            time.sleep(min(CHECK_EVERY, timeout))
            return
        deadline = time.monotonic() + min(SAFETY_NET, timeout)
        while (left := deadline - time.monotonic()) > 0:
            events = self._inotify.read(timeout=max(1, int(left * 1000)))
            if any(event.name == self._name for event in events):
                return  # other files of the directory wake it, but do not end the wait

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None


class FileSource(DecisionSource):
    """Follows a JSON Lines file; position ``line:<n>``; committed line persisted in the state dir."""

    def __init__(self, spec: str, state_dir: Path) -> None:
        super().__init__(spec)
        parts = urlsplit(spec)
        self.path = Path(unquote(parts.path))
        digest = hashlib.sha256(str(self.path).encode()).hexdigest()[:12]
        ensure_private_dir(state_dir)
        self._cursor_path = state_dir / f"source-file-{digest}.cursor"
        try:
            self._committed = int(self._cursor_path.read_text().strip())
        except (FileNotFoundError, ValueError):
            self._committed = 0
        self._handed = self._committed
        self._writes: _Writes | None = None  # opened by the first poll that has to wait
        self._size = -1  # of the file when last read
        self._offset = 0  # bytes of the complete lines read so far
        self._lines = 0  # complete lines before _offset

    @classmethod
    def create(cls, spec: str, state_dir: Path, group: str) -> FileSource:
        return cls(spec, state_dir)

    def poll(self, timeout: float) -> list[Message]:
        """What was appended since the last call, waiting up to ``timeout`` seconds for some."""
        deadline = time.monotonic() + timeout
        if self._writes is None:  # watching before the first read: no write falls between the two
            self._writes = _Writes(self.path)
        out = self._read()
        while not out:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._writes.wait(remaining)
            out = self._read_if_grown()
        return out

    def close(self) -> None:
        if self._writes is not None:
            self._writes.close()
            self._writes = None

    def _read_if_grown(self) -> list[Message]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size == self._size:
            return []
        self._size = size
        return self._read()

    def _read(self) -> list[Message]:
        """The complete lines appended since the last read: read from where the last one ended, not
        the whole file again (a file of 100 000 lines used to be read and split 20 times a second)."""
        try:
            with self.path.open("rb") as file:
                if os.fstat(file.fileno()).st_size < self._offset:  # replaced or truncated
                    self._offset, self._lines = 0, 0
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        self._size = self._offset + len(data)
        end = data.rfind(b"\n")  # what follows the last newline is a writer mid-line
        if end < 0:
            return []
        self._offset += end + 1
        out = []
        for line in data[:end].split(b"\n"):
            self._lines += 1
            if self._lines <= self._handed:
                continue  # handed out before (or committed before a restart)
            if line.strip():
                out.append(Message(line.strip(), Position("line", self._lines, partitioned=False)))
            self._handed = self._lines
        return out

    def commit(self, message: Message) -> None:
        self.commit_many([message])

    def commit_many(self, messages: list[Message]) -> None:
        """One cursor write for the lot (its last line), not one fsync per message."""
        if messages:
            self._committed = max(self._committed, max(m.position.number for m in messages))
            write_atomic(self._cursor_path, b"%d\n" % self._committed)
