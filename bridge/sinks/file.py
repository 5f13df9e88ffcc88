"""``file:///path/records.jsonl``: append one record per line, fsync, then confirm.

The simplest durable destination: for a log shipper that already tails files (Azure Monitor Agent,
Fluent Bit, Vector), and for the demo and tests. A line is confirmed only after ``fsync``.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

from bridge.pipeline import Entry, SinkError, SynchronousSink
from bridge.support.fsutil import datasync


class FileSink(SynchronousSink):
    scheme = "file"

    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        parts = urlsplit(spec)
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise SinkError(f"file sink needs file:///absolute/path.jsonl, got {spec!r}", retryable=False)
        # url2pathname turns file:///C:/logs/x.jsonl into C:\logs\x.jsonl on Windows, /x/y on POSIX.
        self.path = Path(url2pathname(parts.path))
        self._fd: int | None = None

    def open(self) -> None:
        # The directory must exist, and is never created: creating any missing one turned a typo
        # (file:///nonexistent/d.jsonl) into a new directory at the root and a "published" nobody
        # would ever read (issue 33). A service waits for it like for any destination that is down
        # (a mount not there yet), its records kept in the outbox; `decide` fails and says why.
        if not self.path.parent.is_dir():
            raise SinkError(
                f"cannot open {self.path}: the directory {self.path.parent} does not exist", kind="io"
            )
        try:
            self._fd = os.open(
                self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o640
            )
            # A crash can leave half a line at the end; start the next record on a line of its own so
            # readers lose at most the torn line, never the next record too.
            size = os.fstat(self._fd).st_size
            if size:
                with open(self.path, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        os.write(self._fd, b"\n")
        except OSError as err:
            raise SinkError(f"cannot open {self.path}: {err.strerror}", kind="io") from None

    def deliver(self, entry: Entry) -> None:
        if self._fd is None:
            self.open()
        assert self._fd is not None
        os.write(self._fd, entry.payload + b"\n")
        datasync(self._fd)

    def close(self, timeout: float = 5.0) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
