"""Liveness of a service's long-running components, and the rule for giving up.

Why a service must sometimes exit: a thread that dies inside a process that stays up is the worst
failure of all (nothing restarts it, records pile up unsent while the unit looks active). So every
long-running component (the poll loop, each delivery worker, the listener) reports here:

* an internal error it caught and will retry (an outbox read that failed with ``EMFILE`` or ``EIO``,
  a sink that raised): counted in ``se_bridge_component_errors_total{component,kind}`` and listed by
  ``/healthz`` as failing, which still answers 200: retrying is the right thing to do;
* a success, which ends the streak;
* its own end, if unexpected.

A component is declared **failed** when it ended unexpectedly or when its internal errors went on for
``give_up_after`` seconds without one success. Then ``se_bridge_component_up{component}`` is 0,
``/healthz`` answers 503 naming it, and ``on_fatal`` runs once: the service stops and exits non-zero,
so systemd (``Restart=always``) or the Windows service manager starts it again, which reopens every
file and connection. Records are never lost by this: they wait in the outbox. Failures of a
destination (a broker down for hours) are not internal errors and never count here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from bridge.pipeline.metrics import PipelineMetrics

log = logging.getLogger(__name__)

GIVE_UP_AFTER = 300.0  # seconds of uninterrupted internal errors before a component is failed


class Health:
    def __init__(
        self,
        metrics: PipelineMetrics | None = None,
        on_fatal: Callable[[str], None] | None = None,
        *,
        give_up_after: float = GIVE_UP_AFTER,
    ) -> None:
        self._metrics = metrics
        self._on_fatal = on_fatal
        self.give_up_after = give_up_after
        self._lock = threading.Lock()
        self._failing: dict[str, tuple[str, float]] = {}  # component -> (kind, streak start, monotonic)
        self._failed: dict[str, str] = {}  # component -> why
        self._components: set[str] = set()

    def register(self, component: str) -> None:
        with self._lock:
            self._components.add(component)
        if self._metrics is not None:
            self._metrics.component_up.labels(component).set(1)

    def error(self, component: str, kind: str, *, restart_helps: bool = True) -> None:
        """``component`` caught an internal error of ``kind`` and will retry. ``restart_helps=False``
        for conditions a restart cannot cure (a full disk): they never make the service give up."""
        if self._metrics is not None:
            self._metrics.component_errors.labels(component, kind).inc()
        now = time.monotonic()
        with self._lock:
            _, since = self._failing.get(component, (kind, now))
            self._failing[component] = (kind, since)
            hopeless = restart_helps and now - since >= self.give_up_after
        if hopeless:
            self.failed(component, f"{kind} errors for {now - since:.0f} s without a success")

    def ok(self, component: str) -> None:
        """``component`` did its work: any streak of errors is over."""
        if component in self._failing:  # unlocked peek: this is on every delivery and poll
            with self._lock:
                self._failing.pop(component, None)

    def failed(self, component: str, why: str) -> None:
        """``component`` cannot go on: mark it and end the service (once)."""
        with self._lock:
            first = not self._failed
            self._failed.setdefault(component, why)
        if self._metrics is not None:
            self._metrics.component_up.labels(component).set(0)
        log.critical(
            "component failed; the service stops and exits non-zero so that it is restarted",
            extra={"component": component, "reason": why},
        )
        if first and self._on_fatal is not None:
            self._on_fatal(f"{component}: {why}")

    @property
    def fatal(self) -> str | None:
        """Why the service must end (the first component that failed), or None."""
        with self._lock:
            return next((f"{c}: {why}" for c, why in self._failed.items()), None)

    def report(self) -> tuple[bool, dict[str, Any]]:
        """(alive, body) for ``/healthz``."""
        now = time.monotonic()
        with self._lock:
            failing = {
                c: {"errorKind": kind, "forSeconds": round(now - since, 1)}
                for c, (kind, since) in self._failing.items()
                if c not in self._failed
            }
            failed = dict(self._failed)
        body: dict[str, Any] = {"status": "failed" if failed else "ok"}
        if failed:
            body["failed"] = failed
        if failing:
            body["failing"] = failing
        return not failed, body
