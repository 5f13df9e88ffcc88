"""A service's state directory: created private (0700) and locked before any file in it is read.

Two processes on one state directory would each believe they own its outbox, its ledgers and its
pins; the second must stop (exit 2, one line) before it touches the first one's files.
"""

from __future__ import annotations

from pathlib import Path

from bridge.fsutil import DirectoryLocked, ensure_private_dir, lock_directory
from bridge.settings import ConfigError


def lock_state_dir(state_dir: Path) -> int | None:
    """Create the state directory (0700) and take its lock, or refuse to start (exit 2)."""
    try:
        ensure_private_dir(state_dir)
        return lock_directory(state_dir)
    except DirectoryLocked as exc:
        raise ConfigError(f"state_dir: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"state_dir: cannot use {state_dir}: {exc.strerror}") from None
