"""Real storage and process faults for the tests: a small tmpfs that fills up, a process's fd limit.

Nothing here is simulated: a tmpfs mounted with ``size=1m`` answers ENOSPC (and short writes) like a
full disk, and ``prlimit`` on a running process makes every new fd fail with EMFILE. Both need root,
which the tests have here and in CI. Under ``make test`` (``SE_BRIDGE_FAULT_TESTS=required``) a refused
mount fails the test with the reason instead of skipping it, as the Azurite tests do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def refused(reason: str) -> None:
    """Fail under `make test` (SE_BRIDGE_FAULT_TESTS=required), skip with the reason elsewhere."""
    if os.environ.get("SE_BRIDGE_FAULT_TESTS") == "required":
        pytest.fail(reason)
    pytest.skip(reason)


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (created) for the duration of the block."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        refused(f"cannot mount a tmpfs at {path}: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write a file into ``directory`` until its file system answers ENOSPC; returns the file."""
    filler = directory / name
    chunk = b"\0" * 4096
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    # A few bytes may still fit in a partial block: take them too.
    with open(filler, "ab", buffering=0) as f, contextlib.suppress(OSError):
        while f.write(b"\0") == 1:
            pass
    return filler


def lowest_free_fd(pid: int) -> int:
    used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    return next(n for n in range(len(used) + 1) if n not in used)


@contextlib.contextmanager
def no_new_fds(pid: int) -> Iterator[Callable[[], None]]:
    """Lower ``pid``'s RLIMIT_NOFILE so that every open/accept/socket fails with EMFILE.

    The kernel hands out the lowest free fd number and refuses one at or above the limit, so the
    limit is set to the lowest free number; the fds the process holds keep working. A transient fd
    the process closes afterwards (a reconnect, a file opened for one write) leaves a free number
    below the limit, and the next open takes it: the context yields ``tighten`` to lower the limit
    again to the lowest free number (CI saw one such hole let the cursor write through)."""
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)

    def tighten() -> None:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free_fd(pid), hard))

    tighten()
    try:
        yield tighten
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
