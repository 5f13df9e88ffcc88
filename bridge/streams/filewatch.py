"""Waiting for a write to a file: inotify where there is one, a periodic check where there is not.

Why: a decision written to a ``file://`` source used to be noticed by a ``stat`` every 50 ms, 25 ms
late on average and 50 at worst, a fifth of an approval's whole budget (issue 19 item 4), and the
check woke the approver 20 times a second for nothing. Sleeping on inotify, it is read the moment it
is written and the approver does not wake while nothing happens.

One inotify instance serves every file source of the process, read by one thread: an instance is a
scarce per-user resource (``fs.inotify.max_user_instances``, 128 by default for all of a user's
processes) and a console following a fleet's files would otherwise take one per file. The watch is on
the file's directory, which also reports a file created or renamed into place after the watch began
(a writer that rotates). inotify does not see what another host writes to a network filesystem, so
a waiter also returns every :data:`SAFETY_NET` seconds; where inotify cannot be had (not Linux, no
descriptor or instance left, ``fs.inotify.max_user_watches`` reached, no such directory yet) a
waiter returns every :data:`CHECK_EVERY` seconds, as before, and says why once.

``inotify_simple`` (one pure-Python module over the three syscalls, no dependencies) rather than
ctypes by hand; it is a Linux-only dependency, and its absence is the not-Linux case.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

try:  # imported with this module, not at the first wait: a process out of descriptors cannot import
    from inotify_simple import INotify, flags
except ImportError:  # not Linux: the dependency is Linux-only
    INotify = flags = None

log = logging.getLogger(__name__)

#: Without inotify: how often a waiter returns to let its caller check the file (a ``stat``).
CHECK_EVERY = 0.05
#: With inotify: how often a waiter returns anyway, for writes inotify does not report.
SAFETY_NET = 0.5

_Key = tuple[int, str]  # (watch descriptor of the directory, file name)
_Q_OVERFLOW = 0x4000  # IN_Q_OVERFLOW, <sys/inotify.h>


class _Inotify:
    """The process's inotify instance and the thread that reads it: counts the writes to each file
    somebody waits for and wakes the waiters."""

    def __init__(self, inotify: Any, mask: int) -> None:
        self._inotify, self._mask = inotify, mask
        self._cond = threading.Condition()
        self._watchers: Counter[int] = Counter()  # watch descriptor -> sources watching it
        self._files: Counter[_Key] = Counter()  # file -> sources waiting for it
        self._writes: Counter[_Key] = Counter()  # file -> writes seen (only files in ``_files``)
        threading.Thread(target=self._read, name="se-bridge-inotify", daemon=True).start()

    def watch(self, path: Path) -> _Key:
        """Start counting the writes to ``path``; raises OSError as ``inotify_add_watch`` does."""
        with self._cond:
            wd = int(self._inotify.add_watch(path.parent, self._mask))  # the same wd for the same directory
            key = (wd, path.name)
            self._watchers[wd] += 1
            self._files[key] += 1
            return key

    def unwatch(self, key: _Key) -> None:
        with self._cond:
            self._files[key] -= 1
            if self._files[key] <= 0:
                del self._files[key]
                self._writes.pop(key, None)
            self._watchers[key[0]] -= 1
            if self._watchers[key[0]] <= 0:
                del self._watchers[key[0]]
                with contextlib.suppress(OSError):  # the directory is gone, the kernel dropped the watch
                    self._inotify.rm_watch(key[0])

    def writes(self, key: _Key) -> int:
        with self._cond:
            return self._writes[key]

    def wait(self, key: _Key, seen: int, timeout: float) -> None:
        """Until the file had a write more than ``seen``, or ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self._writes[key] != seen, timeout)

    def _read(self) -> None:
        while True:
            try:
                events = self._inotify.read()
            except (
                OSError
            ) as exc:  # not expected of an inotify descriptor; waiters fall back on their timeout
                log.error(
                    "inotify read failed; decisions files are checked every 0.5 s", extra={"error": str(exc)}
                )
                return
            self.note(events)

    def note(self, events: list[Any]) -> None:
        """Count the writes ``events`` report and wake the waiters. When the kernel's queue overflowed
        (``IN_Q_OVERFLOW``, ``fs.inotify.max_queued_events``), events were dropped: every file counts
        as written, so every waiter reads, instead of waiting for its safety net."""
        with self._cond:
            counted = False
            for event in events:
                if event.mask & _Q_OVERFLOW:
                    self._writes.update(self._files.keys())
                    counted = True
                    continue
                key = (event.wd, event.name)
                if key in self._files:
                    self._writes[key] += 1
                    counted = True
            if counted:  # the other files of a busy directory wake nobody
                self._cond.notify_all()


_shared: _Inotify | None = None
_shared_failed = False
_shared_lock = threading.Lock()


def _instance() -> _Inotify | None:
    """The process's inotify, made on first use; None for good once it could not be made."""
    global _shared, _shared_failed
    with _shared_lock:
        if _shared is None and not _shared_failed:
            if INotify is None:  # not Linux
                _shared_failed = True
                return None
            try:
                mask = flags.MODIFY | flags.CLOSE_WRITE | flags.CREATE | flags.MOVED_TO
                _shared = _Inotify(INotify(), mask)
            except OSError as exc:  # out of descriptors or of inotify instances
                _shared_failed = True
                log.warning("inotify unavailable; files are checked every 50 ms", extra={"error": str(exc)})
        return _shared


class FileWrites:
    """Waits for writes to one file. ``mark()`` before reading it, ``wait(mark, timeout)`` after a
    read that found nothing: a write between the two ends the wait at once, none is missed."""

    def __init__(self, path: Path) -> None:
        self._inotify = _instance()
        self._key: _Key | None = None
        if self._inotify is not None:
            try:
                self._key = self._inotify.watch(path)
            except OSError as exc:  # no such directory yet, or fs.inotify.max_user_watches reached
                log.warning(
                    "inotify cannot watch this file; it is checked every 50 ms",
                    extra={"path": str(path), "error": str(exc)},
                )

    @property
    def watching(self) -> bool:
        return self._key is not None

    def mark(self) -> int:
        return self._inotify.writes(self._key) if self._inotify and self._key else 0

    def wait(self, mark: int, timeout: float) -> None:
        """Return once the file may have changed since ``mark``, or after ``timeout`` seconds at most."""
        if self._inotify is None or self._key is None:
            time.sleep(min(CHECK_EVERY, timeout))
            return
        self._inotify.wait(self._key, mark, min(SAFETY_NET, timeout))

    def close(self) -> None:
        if self._inotify is not None and self._key is not None:
            self._inotify.unwatch(self._key)
            self._key = None
