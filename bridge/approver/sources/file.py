"""``file:///path.jsonl``: decisions from a JSON Lines file, followed as it grows.

For a lab, a test or an operator who writes decisions by hand: no broker needed. The position of a
message is its line number; the last committed line is kept in the state directory (written
atomically), so a restarted approver resumes after it. A last line without its newline is a writer
caught mid-line and is read once complete.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bridge.approver.sources.base import DecisionSource, Message, Position
from bridge.fsutil import ensure_private_dir, write_atomic

#: How often a waiting poll checks whether the file grew (a ``stat``: 20 a second cost microseconds).
CHECK_EVERY = 0.05


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
        self._wake = threading.Event()
        self._size = -1  # of the file when last read

    @classmethod
    def create(cls, spec: str, state_dir: Path, group: str) -> FileSource:
        return cls(spec, state_dir)

    def poll(self, timeout: float) -> list[Message]:
        """What was appended since the last call; the file is checked every ``CHECK_EVERY`` seconds
        within ``timeout`` (a ``stat``, so a decision is picked up within about 50 ms)."""
        deadline = time.monotonic() + timeout
        out = self._read()
        while not out and not self._wake.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wake.wait(min(CHECK_EVERY, remaining))
            out = self._read_if_grown()
        return out

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
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        self._size = len(data)
        lines = data.split(b"\n")
        complete = lines[:-1]  # the last piece has no newline yet: a writer is mid-line
        out = []
        for number in range(self._handed + 1, len(complete) + 1):
            line = complete[number - 1].strip()
            if line:
                out.append(Message(line, Position("line", number, partitioned=False)))
            self._handed = number
        return out

    def commit(self, message: Message) -> None:
        self._committed = message.position.number
        write_atomic(self._cursor_path, b"%d\n" % self._committed)
