"""``file:///path.jsonl``: decisions from a JSON Lines file, followed as it grows.

For a lab, a test or an operator who writes decisions by hand: no broker needed. The position of a
message is its line number; the last committed line is kept in the state directory (written
atomically), so a restarted approver resumes after it. A last line without its newline is a writer
caught mid-line and is read once complete.

A waiting poll sleeps until the file is written (:mod:`bridge.streams.filewatch`: inotify,
or a check every 50 ms where there is none), so a decision is read the moment it is written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from bridge.streams.base import DecisionSource, Message, Position
from bridge.streams.filewatch import FileWrites
from bridge.support.fsutil import ensure_private_dir, write_atomic

log = logging.getLogger(__name__)

#: The most one read takes from the file: a backlog is handed out in pieces of about this size.
READ_BYTES = 1024 * 1024
#: The longest line handed on whole (a consumer's own limit refuses it as too large); a longer one is
#: cut to its first LONG_LINE_HEAD bytes (see ``FileSource._skip_long_line``).
MAX_LINE = 16 * 1024 * 1024
LONG_LINE_HEAD = 1024


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
        self._writes: FileWrites | None = None  # made by the first poll
        self._size = -1  # of the file when last read
        self._offset = 0  # bytes of the complete lines read so far
        self._lines = 0  # complete lines before _offset

    @classmethod
    def create(cls, spec: str, state_dir: Path, group: str) -> FileSource:
        return cls(spec, state_dir)

    def missing(self) -> str | None:
        """A file that does not exist is waited for (a writer may create it later), but the reader
        is not ready meanwhile: ``file:///etc/se-bridge/decsions.jsonl`` must not look healthy."""
        return None if self.path.exists() else f"the file {self.path} does not exist (yet)"

    def poll(self, timeout: float) -> list[Message]:
        """What was appended since the last call, waiting up to ``timeout`` seconds for some."""
        deadline = time.monotonic() + timeout
        if self._writes is None:
            self._writes = FileWrites(self.path)
        mark = self._writes.mark()  # before the read: a write after it ends the wait below at once
        out = self._read()
        while not out:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._writes.wait(mark, remaining)
            mark = self._writes.mark()
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
        """The complete lines appended since the last read, at most about :data:`READ_BYTES` of them
        at a time: read from where the last one ended, not the whole file again (a file of 100 000
        lines used to be read and split 20 times a second), and never the whole backlog at once (a
        48.7 MB backlog took Azure's channel to 262 MB). Lines handed out before a restart are
        skipped chunk by chunk, so a poll returns something whenever there is something new."""
        out: list[Message] = []
        try:
            with self.path.open("rb") as file:
                if os.fstat(file.fileno()).st_size < self._offset:  # replaced or truncated
                    self._offset, self._lines = 0, 0
                while not out:
                    file.seek(self._offset)
                    data = file.read(READ_BYTES)
                    end = data.rfind(b"\n")  # what follows the last newline is a writer mid-line
                    if end < 0:
                        if len(data) == READ_BYTES and self._skip_long_line(file, out):
                            continue
                        # nothing complete up to the end: wait for the file to grow past what
                        # was read (not past its size now: a line written since the read would
                        # look seen, and its wake-up would find the file "not grown")
                        self._size = file.tell()
                        return out
                    self._offset += end + 1
                    for line in data[:end].split(b"\n"):
                        self._take(line, out)
                    if len(data) < READ_BYTES:  # the end of the file, as it was when read
                        self._size = self._offset + len(data) - end - 1
                        return out
                self._size = -1  # more to read: the next poll reads on at once
        except FileNotFoundError:
            return out
        return out

    def _take(self, line: bytes, out: list[Message]) -> None:
        self._lines += 1
        if self._lines <= self._handed:
            return  # handed out before (or committed before a restart)
        if line.strip():
            out.append(Message(line.strip(), Position("line", self._lines, partitioned=False)))
        self._handed = self._lines

    def _skip_long_line(self, file: BinaryIO, out: list[Message]) -> bool:
        """A line longer than a read: handed on whole up to :data:`MAX_LINE` (a consumer refuses it
        by its own size limit, as ``tooLarge``); past that, found its end without holding it and handed
        on cut to its first bytes, which the consumer refuses as unreadable (counted, logged,
        dead-lettered) rather than lost unseen. False while its end is not written yet."""
        head = b""
        length = 0
        while True:
            file.seek(self._offset + length)
            data = file.read(READ_BYTES)
            if not data:
                return False
            head = head or data[:LONG_LINE_HEAD]
            newline = data.find(b"\n")
            if newline >= 0:
                length += newline
                break
            length += len(data)
        if length <= MAX_LINE:
            file.seek(self._offset)
            line = file.read(length)
        else:
            log.warning(
                "a line longer than MAX_LINE was cut", extra={"file": str(self.path), "bytes": length}
            )
            line = head
        self._offset += length + 1
        self._take(line, out)
        return True

    def commit(self, message: Message) -> None:
        self.commit_many([message])

    def commit_many(self, messages: list[Message]) -> None:
        """One cursor write for the lot (its last line), not one fsync per message."""
        if messages:
            self._committed = max(self._committed, max(m.position.number for m in messages))
            write_atomic(self._cursor_path, b"%d\n" % self._committed)
