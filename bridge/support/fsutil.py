"""Small durable-file helpers: the state directory must survive SIGKILL, power loss and a full disk.

Everything here creates files 0600 and directories 0700 whatever the umask: a state directory holds
the relay's ledger, the VM identity and records that name the subscription, and on a multi-user VM
nobody but the service account has to read them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
_O_BINARY = getattr(os, "O_BINARY", 0)


class DirectoryLocked(Exception):
    """Another process holds the lock of a state directory."""


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


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) 0700, and tighten it to 0700 if it already exists.

    Parents this creates are 0700 too (``Path.mkdir(parents=True)`` would give them the umask's
    mode); existing parents are left as they are: they may be shared, like ``/var/lib``."""
    missing = []
    p = Path(path)
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=PRIVATE_DIR)
    if os.name == "posix":
        os.chmod(path, PRIVATE_DIR)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data``: continue after a short write; a write of 0 bytes is ENOSPC."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def write_atomic(
    path: Path, data: bytes | Iterable[bytes], durable: bool = True, mode: int = PRIVATE_FILE
) -> None:
    """Replace ``path`` with ``data``: a reader sees the old or the new content, never a mix.

    ``data`` may be chunks, written as they come: a file the size of the fleet (the approver's
    25 MB of pins at 100 000 VMs) is never whole in memory (issue 33: joined first, it was the
    restart's memory peak).

    ``durable=False`` skips the fsyncs: the replacement is still atomic against a process crash
    (the page cache survives SIGKILL), only a power loss may bring back the previous content. A write
    that fails (ENOSPC, EIO) leaves the old content and removes the temporary file.
    """
    tmp = f"{path}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY
    try:
        fd = os.open(tmp, flags, mode)  # new, so ``mode`` applies (a umask can only narrow it)
    except FileExistsError:  # left by a crash, maybe with another mode
        _unlink_quietly(tmp)
        fd = os.open(tmp, flags, mode)
    try:
        for chunk in (data,) if isinstance(data, bytes) else data:
            write_all(fd, chunk)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        _unlink_quietly(tmp)
        raise
    if durable:
        sync_dir(path.parent)


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` (created 0600) and fsync it. On failure whatever part of ``data``
    reached the file is cut off again, so a reader never sees half a line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_BINARY, PRIVATE_FILE)
    try:
        size = os.fstat(fd).st_size
        try:
            write_all(fd, data)
            datasync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def lock_directory(directory: Path) -> int | None:
    """Hold an exclusive lock on ``directory`` for the life of the process (released by the kernel on
    exit, even after SIGKILL). POSIX only; on Windows the service manager runs one instance.

    Take it before touching anything else in the directory: a second process must find it locked
    before it reads, compacts or replaces a file the first one is using."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise DirectoryLocked(
            f"{directory} is in use by another process (one agent or approver per state directory)"
        ) from None
    return fd


def lock_lost(fd: int | None, directory: Path) -> str | None:
    """Why the lock taken by :func:`lock_directory` no longer guards ``directory``, or None: its
    file was unlinked (the directory deleted, or cleaned), or another file now has its name. The
    process would go on writing into unlinked files, and a second process could start beside it."""
    if fd is None:
        return None
    try:
        held = os.fstat(fd)
        if held.st_nlink == 0:
            return f"{directory} was deleted while in use (its lock file is unlinked)"
        current = os.stat(directory / ".lock")
    except FileNotFoundError:
        return f"{directory}/.lock is gone: the state directory was deleted or emptied while in use"
    except OSError as exc:
        return f"{directory} cannot be checked: {exc.strerror}"
    if (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino):
        return f"{directory}/.lock was replaced while in use"
    return None


def watch_lock(
    check: Callable[[], str | None], lost: Callable[[str], None], stop: threading.Event, every: float = 5.0
) -> threading.Thread:
    """Run ``check`` (a :func:`lock_lost` of the caller's) every ``every`` seconds in a daemon
    thread; ``lost(why)`` once when it answers."""

    def run() -> None:
        while not stop.wait(every):
            why = check()
            if why is not None:
                lost(why)
                return

    thread = threading.Thread(target=run, name="state-dir-watch", daemon=True)
    thread.start()
    return thread


def _unlink_quietly(path: Path | str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
