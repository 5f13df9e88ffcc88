"""The shell every long-running service composes: its state directory, its outbox and delivery, its
health, its stop, and the order it shuts down in.

Why one shell: the agent, the approver and Azure's channel each wrote their own, and the copies
drifted (Azure's channel never watched its state directory and exited with a literal 70). A service
now adds only its own loop and routes:

* the state directory is created private and **locked** before any file in it is read (a second
  process on it stops with one line, exit 2), and **watched**: deleted under a running service, the
  service stops with :data:`~bridge.shell.statedir.EXIT_COMPONENT_FAILED` instead of writing into
  unlinked files;
* an **outbox** for every record the service publishes, and one **delivery worker** per sink, opened
  at start (a sink that cannot start is a configuration error, exit 2);
* **health**: a component that fails for good stops the service, and the exit code says so (70);
* **signals**: SIGTERM and SIGINT ask for a stop (logged), never kill;
* **shutdown in order**: the caller's listener and loops first, then the workers drain (at most
  ``shutdown_timeout``) and what is left undelivered is logged, then the outbox is closed and the
  lock released.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from bridge.pipeline import DeliveryWorker, Health, Outbox, OutboxLocked, PipelineMetrics, Sink, SinkError
from bridge.settings import ConfigError
from bridge.shell.statedir import EXIT_COMPONENT_FAILED, lock_state_dir, watch_state_dir
from bridge.support.fsutil import lock_lost

log = logging.getLogger(__name__)


class Shell:
    def __init__(
        self,
        name: str,
        state_dir: Path,
        sinks: Sequence[Sink],
        metrics: PipelineMetrics,
        *,
        lock: int | None = None,
        max_records: int | None = None,
        max_bytes: int | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        """``lock``: the state directory's lock when the caller took it already (a builder that reads
        files in it first); ``on_stop``: what else must notice a stop at once (a poll loop's wake)."""
        self.name = name
        self.state_dir = state_dir
        self.stop_event = threading.Event()
        self._on_stop = on_stop
        self.health = Health(metrics, on_fatal=lambda _why: self.request_stop())
        self._lock_fd = lock if lock is not None else lock_state_dir(state_dir)
        limits: dict[str, int] = {}
        if max_records is not None:
            limits["max_records"] = max_records
        if max_bytes is not None:
            limits["max_bytes"] = max_bytes
        try:
            self.outbox = Outbox(state_dir / "outbox", [s.id for s in sinks], metrics=metrics, **limits)
        except OutboxLocked as exc:
            self.release()
            raise ConfigError(f"state_dir: {exc}") from None
        except OSError as exc:
            self.release()
            raise ConfigError(f"state_dir: cannot use {state_dir}: {exc.strerror}") from None
        self.workers = [
            DeliveryWorker(s, self.outbox, metrics, state_dir / "dead-letter", health=self.health)
            for s in sinks
        ]

    # -- starting ---------------------------------------------------------------------------------

    def install_signals(self) -> None:
        """SIGTERM and SIGINT ask for a stop; the service's loop returns and shuts down in order."""

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("stopping", extra={"service": self.name, "signal": signal.Signals(signum).name})
            self.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def start(self) -> None:
        """Open every sink (one that cannot start is a configuration error), start delivery, and
        watch the state directory (deleted: the service stops, exit 70)."""
        for worker in self.workers:
            try:
                worker.open_at_start()
            except SinkError as err:
                raise ConfigError(f"sink {worker.sink.name}: {err}") from None
        for worker in self.workers:
            worker.start()
        watch_state_dir(
            self._lock_fd, self.state_dir, lambda why: self.health.failed("stateDir", why), self.stop_event
        )

    # -- stopping ---------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self.stop_event.set()
        if self._on_stop is not None:
            self._on_stop()

    def drain(self, timeout: float = 10.0) -> dict[str, int]:
        """Stop delivery, giving each worker ``timeout`` seconds to deliver what it has; what is left
        per sink (it stays in the outbox for the next start)."""
        for worker in self.workers:
            worker.stop(timeout)
        for worker in self.workers:
            worker.join(timeout + 5)
        return {w.sink.name: self.outbox.depth(w.sink.id) for w in self.workers}

    def close(self) -> None:
        """Close the outbox and release the state directory (last: nothing may write after it)."""
        self.outbox.close()
        self.release()

    def lock_lost(self) -> str | None:
        """Why the state directory's lock no longer guards it, or None (bridge.support.fsutil.lock_lost)."""
        return lock_lost(self._lock_fd, self.state_dir)

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def exit_code(self) -> int:
        """0, or :data:`EXIT_COMPONENT_FAILED` (logged) when a component failed for good."""
        if self.health.fatal is None:
            return 0
        log.critical(f"{self.name} stopped because a component failed", extra={"reason": self.health.fatal})
        return EXIT_COMPONENT_FAILED
