"""The agent process: wires IMDS -> poller -> outbox -> delivery workers -> sinks, plus the HTTP API.

Lifecycle:

1. Open the state directory: recover the outbox (cut a torn tail), the sinks' cursors, the baseline
   document and the cached VM identity.
2. Start one delivery worker per sink (records left from before a crash go out first), the HTTP
   listener and the identity resolver.
3. Poll on the main thread until SIGTERM or SIGINT.
4. Stop polling, give the workers ``shutdown_timeout`` seconds to deliver what is queued (whatever is
   left stays in the outbox for the next start), close the sinks, exit 0.

A component that fails for good (a delivery worker that died, internal errors for minutes: see
:mod:`bridge.pipeline.health`) stops the agent the same way, but with exit code 70, so that the
service manager starts it again.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from bridge import __version__, coordination, records
from bridge.agent.access import AccessPolicy
from bridge.agent.answers import RelayAnswers
from bridge.agent.api import AgentApi
from bridge.agent.config import AgentConfig
from bridge.agent.coordinator import PeerCoordinator
from bridge.agent.identity import IdentityResolver
from bridge.agent.impact import ImpactMeter
from bridge.agent.ledger import DecisionLedger
from bridge.agent.metrics import AgentMetrics
from bridge.agent.peerkeys import PeerPins
from bridge.agent.policy import LocalPolicy, PolicyConfig
from bridge.agent.poller import Poller
from bridge.agent.posting import StartRequestPoster
from bridge.agent.proof import DecisionProver
from bridge.agent.relay import Relay
from bridge.agent.state import BaselineStore, IdentityCache
from bridge.coordination import CoordinationPolicy, Verdict
from bridge.http.listener import Listener
from bridge.imds.client import ImdsClient
from bridge.imds.document import ScheduledEvent
from bridge.pipeline import RecordMeta
from bridge.pipeline.storing import REFUSED, until_stored
from bridge.rules import ApprovalRule
from bridge.settings import ConfigError
from bridge.shell.service import Shell
from bridge.signing import KeyRing, NonceStore, RequestVerifier
from bridge.sinks import Sink, SinkError, create_sink
from bridge.support.retry import Backoff

log = logging.getLogger(__name__)

#: Exit code when a component failed for good (EX_SOFTWARE): the service manager restarts the agent.


class Agent:
    def __init__(self, config: AgentConfig, metrics: AgentMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or AgentMetrics()
        self.sinks = build_sinks(config.sink, self.metrics)
        state_dir = Path(config.state_dir)
        # State directory (locked, watched), outbox, delivery, health, stop: the services' one shell.
        # A stop also wakes the poll loop (it may be backing off for seconds).
        self.shell = Shell(
            "agent", state_dir, self.sinks, self.metrics,
            max_records=config.outbox_max_records, max_bytes=config.outbox_max_bytes,
            on_stop=lambda: self.poller.wake() if hasattr(self, "poller") else None,
        )  # fmt: skip
        self.stop_event, self.health = self.shell.stop_event, self.shell.health
        self.outbox, self.workers = self.shell.outbox, self.shell.workers
        self.client = ImdsClient(
            config.imds_url,
            config.api_version,
            timeout=config.imds_timeout,
            first_timeout=config.imds_first_timeout,
            max_rps=config.imds_max_rps,
            metrics=self.metrics,
        )
        self.identity = IdentityResolver(self.client, IdentityCache(state_dir), self.metrics)
        # The relay's exactly-once part first: the poller asks it what this VM approved (a Scheduled
        # event gone after it is completed) and hands it the first document (a POST a previous run
        # left unanswered is resolved against it); the relay then reads documents from the poller.
        answers = RelayAnswers(self.outbox, lambda: self.identity.current, self.metrics, config.api_version)
        self.poster = StartRequestPoster(self.client, DecisionLedger(state_dir), answers)
        self.poller = Poller(
            self.client,
            self.outbox,
            BaselineStore(state_dir),
            self.identity,
            self.metrics,
            interval=config.poll_interval,
            api_version=config.api_version,
            health=self.health,
            approved=self.poster.approved,
            first_document=self.poster.resolve_interrupted,
        )
        self.relay, self.verifier = self._build_relay(state_dir, answers)
        self.impact = ImpactMeter(
            state_dir, self.outbox, lambda: self.identity.current,
            approved=self.poster.approved, boot_id_file=Path(config.boot_id_file),
        )  # fmt: skip
        self.poller.listeners.append(self.impact.on_change)
        self.poller.after_poll.append(self.impact.tick)
        self.policy = self._build_policy()
        # The HTTP API (probes, /metrics, /v1/document, /v1/preparations, the relay): bridge.agent.api.
        self.access: AccessPolicy | None = None
        self.api: Listener | None = None
        if config.listen:
            api = AgentApi(
                config, self.metrics, self.verifier, self.relay, self.poller, lambda: self.identity.current,
                lambda: self.policy, self.health, self._ready_gauged,
            )  # fmt: skip
            self.access, self.api = api.access, api.listener

    def _build_relay(self, state_dir: Path, answers: RelayAnswers) -> tuple[Relay, RequestVerifier]:
        relay = Relay(
            self.client,
            self.poller,
            lambda: self.identity.current,
            self.poster,
            answers,
            require_this_vm=self.config.relay_require_this_vm,
            prover=self._build_prover(),
        )
        try:
            # Nonces are kept in the state directory: a captured request cannot be replayed after a restart.
            nonces = NonceStore(state_dir / "relay-nonces.jsonl")
            return relay, RequestVerifier(KeyRing.from_specs(self.config.relay_key), nonces=nonces)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _build_prover(self) -> DecisionProver:
        try:
            prover = DecisionProver.from_settings(
                self.config.decision_key, self.config.relay_legacy_until, time.time()
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if prover.legacy_until is not None:
            log.warning(
                "MIGRATION: relay requests without a signed decision are acted on until relay_legacy_until",
                extra={"until": self.config.relay_legacy_until, "decisionKeys": prover.keys.ids()},
            )
        elif not prover.keys:
            log.warning(
                "decision_key is not set, so this agent acts on no relayed decision (only its own local "
                "policy approves)"
            )
        return prover

    def _build_policy(self) -> LocalPolicy | None:
        """Local auto-approval rules and hooks; None when none is configured."""
        config = self.config
        try:
            policy = PolicyConfig(
                rules=tuple(ApprovalRule.parse(r) for r in config.auto_approve),
                prepare_hook=config.prepare_hook,
                recover_hook=config.recover_hook,
                hook_timeout=config.hook_timeout,
                hook_margin=config.hook_margin,
                approve_after_prepare=config.approve_after_prepare,
                coordinate=config.coordinate,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not policy.active:
            return None
        local = LocalPolicy(
            policy,
            lambda body, requester: self.relay.handle(body, requester, component="policy"),
            lambda: self.identity.current,
            self.metrics,
            publish=self._publish,
            coordinator=self._build_coordinator() if config.coordinate == "peers" else None,
        )
        self.poller.listeners.append(local.on_change)
        return local

    def _build_coordinator(self) -> PeerCoordinator:
        config = self.config
        if not config.relay_key or not config.listen:
            raise ConfigError(
                "coordinate=peers needs relay_key and listen: the agents of an event ask each other "
                "GET /v1/preparations, signed with the relay key"
            )

        def event(event_id: str) -> ScheduledEvent | None:
            current = self.poller.current
            return None if current is None else current.document.by_id().get(event_id)

        return PeerCoordinator(
            CoordinationPolicy.of(config.coordinate_deadline, config.coordinate_on_deadline),
            this_vm=lambda: self.identity.current.name,
            event=event,
            own_report=lambda event_id: self.policy.report(event_id) if self.policy else None,
            approve=lambda body, requester: self.relay.handle(body, requester, component="coordinator"),
            leave=self._audit_left_to_platform,
            keys=KeyRing.from_specs(config.relay_key),
            pins=PeerPins(Path(config.state_dir)),
            peers=dict(p.split("=", 1) for p in config.peer),
            template=config.peer_url_template,
            stop=self.stop_event,
            takeover=config.coordinate_takeover,
            asked=lambda result: self.metrics.peer_asks.labels(result).inc(),
        )

    def _audit_left_to_platform(self, event_id: str, verdict: Verdict, coordinator: str) -> None:
        """The deadline came with VMs not prepared and the policy approves nothing: say so."""
        record = records.approval_record(
            "coordinator",
            vm=self.identity.current,
            api_version=self.config.api_version,
            decision_id=coordination.decision_id(event_id),
            event_ids=[event_id],
            target=coordinator,
            issued_by=f"coordinator:{coordinator}",
            requester=f"coordinator:{coordinator}",
            outcome="refused",
            reason="leftToPlatform",
            detail=verdict.left_detail(),
            results=[{"eventId": event_id, "result": "refused", "detail": "left to the platform"}],
            start_requests_posted=0,
            coordination=verdict.to_json(coordinator, "platform"),
        )
        self._publish(record)

    def _heartbeats(self) -> None:
        """A heartbeat record every ``heartbeat_interval`` seconds, on the interval's boundaries (so
        every agent's heartbeats of one interval carry the same deterministic slot). Never waits for
        the outbox: a heartbeat is no change, and one that cannot be stored now is simply skipped.
        None before the first poll has finished: it would say ``imdsOk: false`` of an IMDS not asked yet."""
        interval = self.config.heartbeat_interval
        while not self.stop_event.wait(interval - time.time() % interval):
            if not self.poller.polled:
                continue
            current = self.poller.current
            record = records.heartbeat_record(
                self.identity.current,
                current.document if current else None,
                self.poller.failing_for() == 0 and self.poller.first_success is not None,
                interval,
                time.time(),
            )
            try:
                self.outbox.append(RecordMeta.of(record), records.encode(record))
            except REFUSED as exc:  # best effort (bridge.pipeline.storing)
                log.warning("heartbeat skipped: the outbox cannot take it now", extra={"error": str(exc)})

    def _publish(self, record: dict[str, Any]) -> None:
        """Append a record the agent made itself (preparation, coordination audit) to the outbox,
        waiting for room or a working disk: such a record is never dropped (until the agent stops)."""

        def refused(exc: BaseException) -> None:
            log.warning(
                "record waits for the outbox", extra={"recordType": record["recordType"], "error": str(exc)}
            )

        store = lambda: self.outbox.append(RecordMeta.of(record), records.encode(record))  # noqa: E731
        if until_stored(store, self.stop_event, refused, Backoff(base=0.5, cap=10.0)) is None:
            log.error("agent stopping: record not stored", extra={"record": record})

    # -- HTTP endpoints ---------------------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        lost = self.outbox.lock_lost()
        if lost is not None:
            return False, lost
        if self.poller.first_success is None:
            return False, "no successful poll yet"
        failing = self.poller.failing_for()
        if failing > self.config.ready_max_failure:
            return False, f"IMDS failing for {failing:.0f} s"
        return True, "ok"

    def _ready_gauged(self) -> tuple[bool, str]:
        ok, reason = self.ready()
        self.metrics.ready.set(1 if ok else 0)
        return ok, reason

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start everything but the poll loop (used by :meth:`run` and by in-process embedding)."""
        # Delivery, and the state directory watched: deleted under a running agent, records would go
        # into unlinked files and be gone at the next start; it stops (exit 70) and is started afresh.
        self.shell.start()
        if self.api is not None:
            self.api.start()
        self.identity.start(self.stop_event)
        if self.config.heartbeat_interval > 0:
            threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True).start()
        log.info(
            "agent started",
            extra={
                "version": __version__,
                "imdsUrl": self.config.imds_url,
                "apiVersion": self.config.api_version,
                "sinks": [s.name for s in self.sinks],
                "stateDir": str(self.config.state_dir),
                "listen": self.api.address if self.api else None,
                "pendingRecords": self.outbox.pending[0],
            },
        )
        if self.config.poll_interval * self.config.imds_max_rps < 1.0:
            # The IMDS budget spaces requests, polls included: polling faster than it allows only
            # makes polls wait (and StartRequests always go first).
            log.warning(
                "poll_interval is shorter than the IMDS budget allows: polls are spaced by imds_max_rps",
                extra={"pollInterval": self.config.poll_interval, "imdsMaxRps": self.config.imds_max_rps},
            )
        if self.api is not None:
            assert self.access is not None
            how = self.access.describe()
            level = logging.WARNING if self.access.allow_unsigned_loopback else logging.INFO
            log.log(level, f"API access: {how}", extra={"listen": self.config.listen})

    def run(self, install_signals: bool = True) -> int:
        if install_signals:
            self.shell.install_signals()
        self.start()
        # Give the identity a moment (it is normally cached or answers in milliseconds) so the first
        # record names the VM properly; never wait long: events may be seconds from starting.
        self.identity.wait(min(5.0, self.config.imds_first_timeout))
        try:
            self.poller.run(self.stop_event)
        finally:
            self.shutdown()
        return self.shell.exit_code()

    def request_stop(self) -> None:
        """Stop the agent: the poll loop ends now, not at its next poll (it may be backing off)."""
        self.shell.request_stop()

    def shutdown(self) -> None:
        self.request_stop()
        started = time.monotonic()
        left = self.shell.drain(self.config.shutdown_timeout)
        if self.api is not None:
            self.api.stop()
        if self.policy is not None:
            self.policy.close()
        self.impact.close()
        self.client.close()
        self.shell.close()
        log.info(
            "agent stopped", extra={"undelivered": left, "drainSeconds": round(time.monotonic() - started, 3)}
        )


def build_sinks(specs: tuple[str, ...], metrics: AgentMetrics) -> list[Sink]:
    """The agent's sinks, each once (a spec given twice is refused: one destination, two cursors)."""
    sinks: list[Sink] = []
    for spec in specs:
        try:
            sink = create_sink(spec)
        except SinkError as err:
            raise ConfigError(f"sink: {err}") from None
        if any(s.id == sink.id for s in sinks):
            raise ConfigError(f"sink: {sink.name} is configured twice")
        sinks.append(sink)
        metrics.sink_info.labels(sink.id, sink.name).set(1)
    return sinks
