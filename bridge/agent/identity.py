"""Resolve the VM identity once, without ever delaying the first poll for long.

``/metadata/instance`` is read once. Until it answers, the agent uses the identity cached in the
state directory (the normal case after a reboot) or, on a brand-new VM whose IMDS is slow, the host
name; it keeps trying in the background and switches to the real identity when it arrives. A Spot
VM gets 30 seconds of notice: waiting two minutes for instance metadata before polling would miss it.
"""

from __future__ import annotations

import logging
import threading

from bridge.agent.metrics import AgentMetrics
from bridge.agent.state import IdentityCache
from bridge.imds.client import ImdsClient, ImdsError
from bridge.imds.instance import VmIdentity, fallback_identity, identity_from_instance
from bridge.support.observability import ErrorStreak
from bridge.support.retry import Backoff

log = logging.getLogger(__name__)


class IdentityResolver:
    def __init__(self, client: ImdsClient, cache: IdentityCache, metrics: AgentMetrics) -> None:
        self._client = client
        self._cache = cache
        self._metrics = metrics
        cached = cache.load()
        self.current: VmIdentity = cached or fallback_identity()
        self._resolved = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        """Fetch in the background until it succeeds or ``stop`` is set."""
        self._thread = threading.Thread(target=self._run, args=(stop,), name="identity", daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> bool:
        return self._resolved.wait(timeout)

    def _run(self, stop: threading.Event) -> None:
        streak = ErrorStreak(log, "reading VM identity from /metadata/instance")
        backoff = Backoff(base=2.0, cap=60.0)
        while not stop.is_set():
            try:
                identity = identity_from_instance(self._client.get_instance())
            except (ImdsError, ValueError) as exc:
                streak.failure(getattr(exc, "kind", "invalid"), str(exc), usingIdentity=self.current.source)
                stop.wait(backoff.next_delay())
                continue
            streak.success()
            if identity != self.current:
                log.info("VM identity", extra={"vmId": identity.vm_id, "vmName": identity.name})
            self.current = identity
            self._metrics.identity_known.set(1)
            try:
                self._cache.save(identity)
            except OSError as exc:
                log.warning("cannot cache VM identity", extra={"error": str(exc)})
            self._resolved.set()
            return
