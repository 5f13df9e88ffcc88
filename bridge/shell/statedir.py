"""A service's state directory: created private (0700) and locked before any file in it is read.

Two processes on one state directory would each believe they own its outbox, its ledgers and its
pins; the second must stop (exit 2, one line) before it touches the first one's files.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from bridge.settings import ConfigError
from bridge.support.fsutil import DirectoryLocked, ensure_private_dir, lock_directory, lock_lost, watch_lock

#: The exit code of a service that stopped because a part of it failed for good (its state directory
#: deleted under it, a sink's disk gone): the service manager starts it afresh. One value for every
#: service (issue 32: Azure's channel wrote a literal 70, and never watched its directory).
EXIT_COMPONENT_FAILED = 70


def lock_state_dir(state_dir: Path) -> int | None:
    """Create the state directory (0700) and take its lock, or refuse to start (exit 2)."""
    try:
        ensure_private_dir(state_dir)
        return lock_directory(state_dir)
    except DirectoryLocked as exc:
        raise ConfigError(f"state_dir: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"state_dir: cannot use {state_dir}: {exc.strerror}") from None


def watch_state_dir(
    fd: int | None, state_dir: Path, failed: Callable[[str], None], stop: threading.Event
) -> threading.Thread:
    """Check every 5 s that ``fd``'s lock still guards ``state_dir``; ``failed(why)`` once when not (a
    deleted state directory: the service would go on writing into unlinked files, and a second one
    could start beside it). Every service stops on it with :data:`EXIT_COMPONENT_FAILED`."""
    return watch_lock(lambda: lock_lost(fd, state_dir), failed, stop)
