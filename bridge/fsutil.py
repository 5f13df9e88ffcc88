"""Small durable-file helpers: the state directory must survive SIGKILL and power loss."""

from __future__ import annotations

import os
from pathlib import Path


def datasync(fd: int) -> None:
    """Flush file data (and the size) to stable storage."""
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def sync_dir(path: Path) -> None:
    """Make a new or renamed directory entry durable (POSIX; Windows has no directory fsync)."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data``: a reader sees the old or the new content, never a mix.

    ``durable=False`` skips the fsyncs: the replacement is still atomic against a process crash
    (the page cache survives SIGKILL), only a power loss may bring back the previous content.
    """
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        sync_dir(path.parent)
