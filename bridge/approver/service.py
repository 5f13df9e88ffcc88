"""The approver process: decisions -> validation -> routing -> agent relay -> audit record.

The approver reads decisions from its source and hands each to its VM's lane; what happens to one
decision, from its message to its commit, is :mod:`bridge.approver.lifecycle` (validate, store
"started", relay, audit, store final, commit), the audit records and the waiting for the disk
:mod:`bridge.approver.auditing`, the fleet coordinator's verdicts :mod:`bridge.approver.coordinated`.
This module is the service around them: building the parts, the run loop (read, hand to the lanes,
commit in order), readiness, ``/healthz`` ``/readyz`` ``/metrics``, SIGTERM.

Every decision ends as exactly one audit record with an outcome (approved, refused with a reason,
failed after retries): nothing is silently dropped.

Around it: :mod:`bridge.approver.build` makes an approver from its configuration,
:mod:`bridge.approver.relaying` carries decisions to an agent (failover, ARM),
:mod:`bridge.approver.dispatch` runs the per-VM lanes and keeps commits in order,
:mod:`bridge.approver.standby` acts for a sibling instance that died,
:mod:`bridge.approver.metrics` holds the approver's series.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from bridge import __version__
from bridge import decisions as decision_module
from bridge.approver.arm import ArmAcknowledger
from bridge.approver.auditing import AUDIT_OUTCOMES, AuditWriter
from bridge.approver.coordinated import CoordinatedApprovals
from bridge.approver.coordinator import FleetCoordinator
from bridge.approver.dispatch import OrderedCommits, Slot
from bridge.approver.lifecycle import DecisionLife
from bridge.approver.metrics import ApproverMetrics
from bridge.approver.relaying import Relayer
from bridge.approver.routing import FleetRouter, LocalRouter, RelayClient
from bridge.approver.standby import Standby
from bridge.approver.store import DecisionStore
from bridge.coordination import CoordinationPolicy, Verdict
from bridge.decisions import SigningKey, ValidationPolicy
from bridge.errors import BridgeError
from bridge.http.apiguard import guarded_listener
from bridge.http.listener import Listener, probe_routes
from bridge.shell.service import Shell
from bridge.shell.statedir import EXIT_COMPONENT_FAILED
from bridge.sinks import Sink
from bridge.streams import DecisionSource, Message, SourceError
from bridge.streams.base import lag_of
from bridge.support.observability import ErrorStreak
from bridge.support.retry import Backoff

__all__ = ["AUDIT_OUTCOMES", "EXIT_COMPONENT_FAILED", "Approver"]

log = logging.getLogger(__name__)

#: Parked decisions at most; reading waits beyond (memory stays bounded while agents are down).
MAX_PARKED = 10_000
#: The approver is not ready once reading decisions has failed for this long (a broker blip is not).
READY_MAX_FAILURE = 30.0
#: The approver's own read path: ``/metrics`` names its sinks and sources, so remote scrapers need
#: the read token (``/healthz`` and ``/readyz`` stay open for probes).
READ_PATHS = frozenset({"/metrics"})
#: Exit code when a component failed for good (EX_SOFTWARE): the service manager restarts the approver.


class Approver:
    def __init__(
        self,
        source: DecisionSource,
        router: LocalRouter | FleetRouter,
        relay: RelayClient,
        policy: ValidationPolicy,
        sinks: list[Sink],
        state_dir: Path,
        *,
        relay_attempts: int = 1,
        metrics: ApproverMetrics | None = None,
        lock: int | None = None,
        arm: ArmAcknowledger | None = None,
        arm_mode: str = "off",
        coordination_policy: CoordinationPolicy | None = None,
        instance: str = "",
        standby_after: float = 0.0,
        coordinator_key: tuple[str, SigningKey] | None = None,
        audit_signer: tuple[str, bytes] | None = None,
    ) -> None:
        self.source = source
        self.router = router
        self.metrics = metrics or ApproverMetrics()
        self.metrics.ownership.source = source
        if isinstance(router, FleetRouter):
            self.metrics.fleet.counts = router.view.counts
            self.metrics.fleet.lag = lambda: lag_of(router.sources)
            self.metrics.fleet.read = router.records_read
            refused = self.metrics.fleet_claims_refused
            router.view.on_refused = lambda reason: refused.labels(reason).inc()
        # State directory (locked, watched), outbox, delivery, health, stop: the services' one shell.
        self.shell = Shell("approver", state_dir, sinks, self.metrics, lock=lock)
        self.stop_event, self.health = self.shell.stop_event, self.shell.health
        self.outbox, self.workers = self.shell.outbox, self.shell.workers
        self.state_dir = state_dir
        # Remembered as long as a decision can live (and an hour more): a replay after that is refused
        # ``expired`` by validation before the store is asked.
        self.store = DecisionStore(state_dir, keep=policy.max_ttl + policy.max_skew + 3600.0)
        self.relayer = Relayer(
            router, relay, attempts=relay_attempts, stop_event=self.stop_event, arm=arm, arm_mode=arm_mode
        )
        self.commits = OrderedCommits(self._commit)
        self.audit = AuditWriter(self.outbox, self.store, self.metrics, self.stop_event, audit_signer)
        self.standby: Standby | None = None  # built below; the life asks it whether an owner finished
        self.life = DecisionLife(
            policy=policy, router=router, relayer=self.relayer, store=self.store, audit=self.audit,
            commits=self.commits, metrics=self.metrics, stop_event=self.stop_event,
            owner_finished=lambda m: self.standby is not None and self.standby.owner_finished(m),
        )  # fmt: skip
        self.api: Listener | None = None
        self._source_open = False
        self._streak = ErrorStreak(log, f"reading decisions from {source.name}")
        self.instance = instance or "approver"
        self.coordinator: FleetCoordinator | None = None
        self._coordinated: CoordinatedApprovals | None = None
        if coordination_policy is not None:
            if not isinstance(router, FleetRouter):
                raise ValueError("only a fleet approver coordinates")
            self._coordinated = CoordinatedApprovals(
                self.life, self.audit, self.store, self.metrics,
                instance=self.instance, on_deadline=coordination_policy.on_deadline, signer=coordinator_key,
            )  # fmt: skip
            self.coordinator = FleetCoordinator(
                coordination_policy, runs_agent=router.knows, leader=source.leads, act=self.coordinated
            )
            router.observers.append(self.coordinator.observe)
        self.standby = self._build_standby(state_dir, standby_after)
        if isinstance(router, FleetRouter):  # se_bridge_records_refused_total: the events stream's
            self.metrics.registry.register(router.reader)

    def _build_standby(self, state_dir: Path, after: float) -> Standby | None:
        """A fleet approver on a partitioned source stands by for its siblings (bridge.approver.standby)."""
        if after <= 0 or not isinstance(self.router, FleetRouter):
            return None
        reader = self.source.standby(self.instance, state_dir / "standby")
        if reader is None:
            return None
        acted = self.metrics.standby_acted
        return Standby(reader, self.source, self._act_as_standby, after=after, on_acted=acted.inc)

    def _act_as_standby(self, messages: list[Message]) -> None:
        """Decisions another instance owns and did not finish in time: through the lanes like any
        decision, never committed here (bridge.approver.standby)."""
        for message in messages:
            if not self.life.add(message, Slot(message, standby=True)):
                return

    # -- what the parts do, for callers that hold the approver ----------------------------------------

    def process(
        self, message: Message, now: float | None = None, slot: Slot | None = None
    ) -> dict[str, Any] | None:
        """One message to its final outcome (bridge.approver.lifecycle)."""
        return self.life.process(message, now, slot)

    def coordinated(self, event_id: str, members: list[str], verdict: Verdict) -> bool:
        """Act on the fleet coordinator's verdict for one event (bridge.approver.coordinated)."""
        assert self._coordinated is not None
        return self._coordinated.act(event_id, members, verdict)

    def _commit(self, messages: list[Message]) -> None:
        try:
            self.source.commit_many(messages)
        except SourceError as exc:  # a lost commit means a re-read, which the store recognises
            log.warning("commit failed; the decision may be read again", extra={"error": str(exc)})

    # -- the HTTP API: /healthz, /readyz, /metrics -----------------------------------------------------

    def serve(self, listen: str, *, read_token_file: str | None = None) -> None:
        """Bind ``listen`` now (a port in use is a start-up error); :meth:`run` starts serving.
        The same guard as the agent's API: no browsers, remote scrapes need the read token."""
        refused = self.metrics.http_refused
        self.api = guarded_listener(
            listen,
            probe_routes(self.health.report, self.ready, self.metrics.registry),
            READ_PATHS,
            read_token_file=read_token_file,
            on_refused=lambda reason: refused.labels(reason).inc(),
        )

    def listening_on(self) -> str | None:
        """The bound address as ``host:port`` (the real port when ``--listen`` asked for port 0)."""
        if self.api is None:
            return None
        address = self.api.address
        if isinstance(address, str):
            return f"unix:{address}"
        host, port = address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def lock_lost(self) -> str | None:
        """Why the state directory's lock no longer guards it, or None (bridge.support.fsutil.lock_lost)."""
        return self.shell.lock_lost()

    def ready(self) -> tuple[bool, str]:
        """Ready when a decision published now would be acted on at once: the decisions source is open
        and its group gave this instance its share, a fleet approver has read the events stream to
        its end and its standby is reading, and reading has not failed for long (issue 19)."""
        if self.health.fatal is not None:
            return False, f"component failed: {self.health.fatal}"
        lost = self.lock_lost()
        if lost is not None:
            return False, lost
        if not self._source_open:
            return False, "decisions source not open yet"
        missing = self.source.missing()
        if missing is not None:
            return False, f"decisions source: {missing}"
        if not self.source.assigned():
            return False, "waiting for the consumer group to assign partitions"
        if isinstance(self.router, FleetRouter) and not self.router.caught_up():
            return False, "reading the events stream (agents and events not learned yet)"
        if self.standby is not None and not self.standby.caught_up.is_set():
            return False, "standby reader not caught up yet"
        if self._streak.failures:
            failing = time.monotonic() - self._streak.since
            if failing > READY_MAX_FAILURE:
                return False, f"reading decisions failing for {failing:.0f} s"
        return True, "ok"

    # -- the loop ---------------------------------------------------------------------------------------

    def run(self, install_signals: bool = True) -> int:
        if install_signals:
            self.shell.install_signals()
        self._start_components()
        try:
            if not self._open_source():
                return 2
            self._consume()
        finally:
            self.shutdown()
        return self.shell.exit_code()

    def _start_components(self) -> None:
        decision_module.warm_up()
        self.shell.start()  # delivery, and the state directory watched (deleted: exit 70)
        self.router.start(self.stop_event)
        if self.standby is not None:
            threading.Thread(
                target=self.standby.run, args=(self.stop_event,), name="standby", daemon=True
            ).start()
        threading.Thread(
            target=self.life.parking.run, args=(self.stop_event,), name="parking", daemon=True
        ).start()
        if self.coordinator is not None:
            threading.Thread(
                target=self.coordinator.run, args=(self.stop_event,), name="coordinator", daemon=True
            ).start()
        if self.api is not None:
            self.api.start()
        log.info(
            "approver started",
            extra={
                "version": __version__,
                "source": self.source.name,
                "sinks": [w.sink.name for w in self.workers],
                "listen": self.listening_on(),
            },
        )

    def _consume(self) -> None:
        """Read decisions and hand each to its VM's lane until stopped or the source is exhausted;
        commits follow in read order as decisions finish (bridge.approver.dispatch)."""
        while not self.stop_event.is_set():
            if self.life.parking.count >= MAX_PARKED:  # agents away: hold reading, keep committing
                self.commits.commit_ready()
                self.stop_event.wait(0.5)
                continue
            try:
                # While decisions are in flight, come back soon to commit them as they finish: a
                # standby elsewhere reads the group's commits to know what is done.
                messages = self.source.poll(0.05 if self.commits.pending else 0.5)
            except Exception as exc:  # a broken source must not end the approver: back off
                self._source_failed(exc)
                self.stop_event.wait(2.0)
                continue
            self._streak.success()
            self.metrics.source_ready.set(1)
            for message in messages:
                slot = self.commits.track(message)
                if not self.life.add(message, slot):
                    return  # stopping: what was not finished is read again after the restart
            self.commits.commit_ready()
            if self.source.exhausted:
                self.commits.wait_drained(self.stop_event)
                return

    def _open_source(self) -> bool:
        """Open the decisions source: a configuration that can never work ends the approver (exit 2,
        one clear line); an unreachable source is retried until it answers or the approver stops."""
        backoff = Backoff(base=1.0, cap=30.0)
        while not self.stop_event.is_set():
            try:
                self.source.open()
                self._source_open = True
                self.metrics.source_ready.set(1)
                return True
            except SourceError as exc:
                if not exc.retryable:
                    self.metrics.source_errors.labels(exc.kind).inc()
                    log.error(
                        "decisions source refused", extra={"source": self.source.name, "error": str(exc)}
                    )
                    return False
                self._source_failed(exc)
                self.stop_event.wait(backoff.next_delay())
        return True

    def _source_failed(self, exc: Exception) -> None:
        """Count and log (once per streak) a failed open or read of the decisions source."""
        kind = exc.kind if isinstance(exc, BridgeError) else "other"
        self.metrics.source_errors.labels(kind).inc()
        self.metrics.source_ready.set(0)
        self._streak.failure(kind, str(exc))

    def close(self) -> None:
        """Release the state directory: the decision store, the outbox and the lock."""
        self.store.close()
        self.shell.close()

    def shutdown(self) -> None:
        self.stop_event.set()
        if self.api is not None:
            self.api.stop()
        self.life.lanes.close()  # lanes see the stop and leave unfinished decisions uncommitted
        self.commits.commit_ready()  # what did finish is committed (a re-read would be harmless)
        left = self.shell.drain(10.0)
        self.source.close()
        self.close()
        log.info("approver stopped", extra={"undelivered": left})
