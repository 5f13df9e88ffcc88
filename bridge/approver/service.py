"""The approver process: decisions -> validation -> routing -> agent relay -> audit record.

For each message of the decisions source, in order:

1. decode and validate it (:mod:`bridge.approver.decision`); anything not proven valid is refused;
2. check the decision store: a decision id already final is a replay (refused), unless it is the very
   same message read again after a crash (then it is only committed);
3. record the decision as started, relay it to an agent (:mod:`bridge.approver.routing`), which
   checks that the event still waits for approval and posts the StartRequest exactly once;
4. record the final outcome, publish it as an audit record (``recordType: approval``) through the
   approver's own outbox and sinks, and only then commit the message in the source.

Every decision ends as exactly one audit record with an outcome (approved, refused with a reason,
failed after retries): nothing is silently dropped.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bridge import __version__, coordination, records
from bridge.apiguard import ApiGuard
from bridge.approver import decision as decision_module
from bridge.approver import topology
from bridge.approver.arm import ArmAcknowledger
from bridge.approver.coordinator import FleetCoordinator
from bridge.approver.decision import DecisionRefused, ValidationPolicy, validate
from bridge.approver.dispatch import Lanes, OrderedCommits, Slot
from bridge.approver.routing import FleetRouter, LocalRouter, RelayClient, RelayUnavailable
from bridge.approver.sources import DecisionSource, Message, SourceError, create_source
from bridge.approver.store import DecisionStore
from bridge.coordination import CoordinationPolicy, Verdict
from bridge.errors import BridgeError
from bridge.fsutil import DirectoryLocked, ensure_private_dir, lock_directory
from bridge.listener import Listener, probe_routes
from bridge.observability import ErrorStreak
from bridge.pipeline import (
    DeliveryWorker,
    Health,
    Outbox,
    OutboxFull,
    OutboxLocked,
    OutboxWriteError,
    RecordMeta,
)
from bridge.pipeline.metrics import PipelineMetrics, counter, gauge
from bridge.retry import Backoff
from bridge.sinks import Sink

log = logging.getLogger(__name__)

#: A decision is a few hundred bytes; anything far larger is refused before it is parsed.
MAX_MESSAGE_BYTES = 16 * 1024
#: Attempts at a message whose processing raises before it is refused as ``unprocessable``.
POISON_ATTEMPTS = 3
#: The decision schema's length bounds of the fields an audit record repeats.
AUDIT_FIELD_LIMITS = {"decisionId": 128, "eventId": 128, "target": 128, "issuedBy": 256}


#: Lanes (VMs) processed at once, messages read and not finished, decisions per relay request
#: (bridge.approver.dispatch); a relay request also stays below the agent's 64 KiB body limit.
LANE_WORKERS = 8
MAX_IN_FLIGHT = 256
LANE_BATCH = 50
MAX_RELAY_BYTES = 32 * 1024

#: What a state directory's file system answers when it cannot keep a write (full, quota, failing,
#: read-only): the decision waits for the disk, it is never counted as a poison attempt.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})

#: The approver is not ready once reading decisions has failed for this long (a broker blip is not).
READY_MAX_FAILURE = 30.0
#: The approver's own read path: ``/metrics`` names its sinks and sources, so remote scrapers need
#: the read token (``/healthz`` and ``/readyz`` stay open for probes).
READ_PATHS = frozenset({"/metrics"})

#: Exit code when a component failed for good (EX_SOFTWARE): the service manager restarts the approver.
EXIT_COMPONENT_FAILED = 70


class OwnershipCollector:
    """``se_bridge_approver_partitions_owned`` and ``se_bridge_approver_partition_lag{partition}``,
    read from the decisions source when scraped (labels: partition ids, bounded by the topic's or
    hub's partition count)."""

    def __init__(self) -> None:
        self.source: DecisionSource | None = None

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        owned = self.source.ownership() if self.source is not None else {}
        count = GaugeMetricFamily(
            "se_bridge_approver_partitions_owned", "Partitions of the decisions source this instance reads."
        )
        count.add_metric([], len(owned))
        lag = GaugeMetricFamily(
            "se_bridge_approver_partition_lag",
            "Messages of an owned partition not read yet (Kafka; absent when unknown).",
            labels=["partition"],
        )
        for partition, behind in sorted(owned.items()):
            if behind is not None:
                lag.add_metric([partition], behind)
        yield count
        yield lag


class ApproverMetrics(PipelineMetrics):
    """The pipeline's sink/outbox series (same names as the agent's, so dashboards work for both)
    plus the approver's own, declared below. ``reason`` is a closed set (the decision schema's refusal
    reasons and the relay's), ``kind`` an :class:`~bridge.errors.BridgeError` kind."""

    decisions = counter(
        "se_bridge_approver_decisions", "Decisions by outcome and reason.", "outcome", "reason"
    )
    source_errors = counter(
        "se_bridge_approver_source_errors",
        "Failed attempts to open or read the decisions source, by kind (retried with backoff).",
        "kind",
    )
    skipped = counter(
        "se_bridge_approver_decisions_skipped",
        "Valid decisions a local approver left to another VM's approver (no relay, no audit record).",
        "reason",
    )
    source_ready = gauge(
        "se_bridge_approver_source_ready", "1 while the decisions source is open and reads succeed."
    )
    coordinated = counter(
        "se_bridge_approver_coordinated",
        "Coordinated verdicts acted on, by action (approve, leave) and why (allPrepared, deadline).",
        "action",
        "why",
    )

    def __init__(self) -> None:
        super().__init__()
        self.ownership = OwnershipCollector()
        self.registry.register(self.ownership)


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
        relay_attempts: int = 3,
        metrics: ApproverMetrics | None = None,
        lock: int | None = None,
        arm: ArmAcknowledger | None = None,
        arm_mode: str = "off",
        coordination_policy: CoordinationPolicy | None = None,
        instance: str = "",
    ) -> None:
        self.source = source
        self.arm = arm  # Azure Resource Manager: a fallback (or the only path) when no agent answers
        self.arm_mode = arm_mode if arm is not None else "off"
        self.router = router
        self.relay = relay
        self.policy = policy
        self.metrics = metrics or ApproverMetrics()
        self.metrics.ownership.source = source
        self.stop_event = threading.Event()
        self.health = Health(self.metrics, on_fatal=lambda _why: self.stop_event.set())
        self._lock_fd = lock if lock is not None else lock_state_dir(state_dir)
        self.store = DecisionStore(state_dir)
        try:
            self.outbox = Outbox(state_dir / "outbox", [s.id for s in sinks], metrics=self.metrics)
        except OutboxLocked as exc:
            from bridge.config import ConfigError

            raise ConfigError(f"state_dir: {exc}") from None
        self.workers = [
            DeliveryWorker(s, self.outbox, self.metrics, state_dir / "dead-letter", health=self.health)
            for s in sinks
        ]
        self.relay_attempts = relay_attempts
        self.commits = OrderedCommits(self._commit)
        self.lanes = Lanes(
            self._drain_lane, workers=LANE_WORKERS, max_in_flight=MAX_IN_FLIGHT, batch=LANE_BATCH
        )
        self.api: Listener | None = None
        self._source_open = False
        self._streak = ErrorStreak(log, f"reading decisions from {source.name}")
        self._outbox_streak = ErrorStreak(log, "storing decisions and audit records")
        self.coordinator: FleetCoordinator | None = None
        if coordination_policy is not None:
            if not isinstance(router, FleetRouter):
                raise ValueError("only a fleet approver coordinates")
            self.coordinator = FleetCoordinator(
                coordination_policy, runs_agent=router.knows, leader=source.leads, act=self.coordinated
            )
            router.observers.append(self.coordinator.observe)
        self.instance = instance or "approver"

    # -- one decision ---------------------------------------------------------------------------------

    def process(self, message: Message, now: float | None = None) -> dict[str, Any]:
        """Take one message to a final outcome and publish its audit record. Returns the audit."""
        prepared = self._prepare(message, now)
        if not isinstance(prepared, tuple):
            return prepared
        decision, body = prepared
        answer, detail = self._relay(decision, body)
        return self._finish_relayed(decision, message, answer, detail)

    def _prepare(
        self, message: Message, now: float | None = None, *, sync: bool = True
    ) -> dict[str, Any] | tuple[dict[str, Any], dict[str, Any]]:
        """Everything before the relay: the final result (a refusal, a skip, a re-read) or the
        validated decision, recorded as started, and its relay body.

        Everything about the message is proven before anything is stored: only a decision that
        passed every check claims its ``decisionId`` (an unsigned or malformed message cannot burn
        the id of the real decision that follows it)."""
        now = time.time() if now is None else now
        try:
            decision = self._validated(message, now)
        except DecisionRefused as refusal:
            raw = _loads_object(message.payload)
            return self._finish(
                raw, message, "refused", refusal.reason, refusal.detail, [], record_final=False
            )
        if not self.router.owns(decision):
            self.metrics.skipped.labels("otherVm").inc()
            log.debug("decision for another VM skipped", extra={"decisionId": decision["decisionId"]})
            return {"outcome": "skipped", "reason": "otherVm"}
        decision_id: str = decision["decisionId"]
        earlier = self.store.get(decision_id)
        if earlier is not None and earlier["state"] == "final":
            if earlier.get("position") == message.position:
                log.info(
                    "decision already final (re-read after a restart)", extra={"decisionId": decision_id}
                )
                return {"outcome": earlier["outcome"], "reason": earlier.get("reason"), "reread": True}
            detail = f"decision id already used ({earlier['outcome']})"
            return self._finish(decision, message, "refused", "replayed", detail, [], record_final=False)
        self.store.started(decision_id, message.position, sync=sync)
        body = {
            "decisionId": decision_id,
            "eventIds": [decision["eventId"]],
            "target": decision["target"],
            "issuedBy": decision["issuedBy"],
        }
        return decision, body

    def _finish_relayed(
        self,
        decision: dict[str, Any],
        message: Message,
        answer: dict[str, Any] | None,
        detail: str,
        *,
        sync: bool = True,
        coordination: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if answer is None:
            return self._finish(
                decision,
                message,
                "failed",
                "relayUnavailable",
                detail,
                [],
                sync=sync,
                coordination=coordination,
            )
        return self._finish(
            decision,
            message,
            answer.get("outcome", "failed"),
            answer.get("reason"),
            answer.get("detail"),
            answer.get("results") or [],
            relay=answer.get("relay"),
            sync=sync,
            path=answer.get("path"),
            arm_correlation_id=answer.get("armCorrelationId"),
            coordination=coordination,
        )

    def _validated(self, message: Message, now: float) -> dict[str, Any]:
        """The decision in ``message`` once every check passed; :class:`DecisionRefused` otherwise.
        Nothing here raises anything else: a message that cannot be read is a refusal, never a
        retry (a poison message must not wedge the source)."""
        if len(message.payload) > MAX_MESSAGE_BYTES:
            raise DecisionRefused(
                "tooLarge", f"message of {len(message.payload)} bytes (at most {MAX_MESSAGE_BYTES})"
            )
        decision = _loads_object(message.payload)
        if decision is None:
            raise DecisionRefused("schema", "message is not a JSON object")
        try:
            return validate(decision, self.policy, now)
        except DecisionRefused:
            raise
        except Exception as exc:  # a check that could not run proves nothing: refuse
            raise DecisionRefused("schema", f"cannot be validated: {type(exc).__name__}: {exc}") from None

    def _relay(self, decision: dict[str, Any], body: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        return self._relay_many([decision], [body])[0]

    def _relay_many(
        self, decisions: list[dict[str, Any]], bodies: list[dict[str, Any]]
    ) -> list[tuple[dict[str, Any] | None, str]]:
        """Relay decisions for one VM in one request (their order kept), trying each candidate agent
        (fleet failover) a few times; ``(None, why)`` for each when none answered."""
        if self.arm_mode == "only":
            return self._through_arm(decisions)
        errors: list[str] = []
        never_sent = True  # no request reached any agent: another path cannot approve twice
        backoff = Backoff(base=0.5, cap=5.0)
        for attempt in range(self.relay_attempts):
            candidates = list(dict.fromkeys(u for d in decisions for u in self.router.candidates(d)))
            if not candidates:
                errors.append("no agent known for the event's VMs")
            for url in candidates:
                try:
                    answers = self.relay.start_requests_many(url, bodies)
                except RelayUnavailable as exc:
                    errors.append(str(exc))
                    never_sent = never_sent and exc.never_sent
                    log.warning(
                        "agent did not answer, trying the next", extra={"relay": url, "error": str(exc)}
                    )
                    continue
                return [({**answer, "relay": url, "path": "relay"}, "") for answer in answers]
            if attempt + 1 < self.relay_attempts and not self.stop_event.is_set():
                self.stop_event.wait(backoff.next_delay())
        why = "; ".join(errors[-3:])
        if self.arm_mode == "fallback" and never_sent:
            log.warning("no agent of the event could be reached: approving through ARM", extra={"error": why})
            return self._through_arm(decisions)
        return [(None, why)] * len(bodies)

    def _through_arm(self, decisions: list[dict[str, Any]]) -> list[tuple[dict[str, Any] | None, str]]:
        """Acknowledge each decision's event through Azure Resource Manager (bridge.approver.arm), on
        the target VM's resource, or another VM's of the event when the target's is not known."""
        assert self.arm is not None
        out: list[tuple[dict[str, Any] | None, str]] = []
        for decision in decisions:
            event_id, resource_id = decision["eventId"], self.router.resource_id(decision)
            if resource_id is None:
                out.append((None, "ARM: no resource id known for the event's VMs"))
                continue
            answer = self.arm.acknowledge(resource_id, event_id)
            result = {
                "eventId": event_id,
                "result": "approved" if answer.outcome == "approved" else "armError",
                "detail": answer.detail,
            }
            finished = {
                "decisionId": decision["decisionId"],
                "outcome": answer.outcome,
                "reason": answer.reason,
                "detail": answer.detail,
                "results": [result],
                "relay": "arm",
                "path": "arm",
                "armCorrelationId": answer.correlation_id,
            }
            out.append((finished, ""))
        return out

    # -- coordinated approval (bridge.approver.coordinator) ---------------------------------------------

    def coordinated(self, event_id: str, members: list[str], verdict: Verdict) -> None:
        """Act on the fleet coordinator's verdict for one event: approve it through an agent of the
        event (the decision store makes it once per event id), or audit that the platform decides.
        A full or failing disk is waited out: a verdict is never dropped (until the approver stops)."""
        assert self.coordinator is not None
        decision_id = coordination.decision_id(event_id)
        coordinator = f"fleet-approver:{self.instance}"
        decision = {
            "decisionId": decision_id,
            "eventId": event_id,
            # The first prepared VM: its agent is live and its ledger sees any repeat of this id.
            "target": (verdict.prepared or verdict.waited_for or tuple(members) or ("",))[0],
            "issuedBy": f"coordinator:{coordinator}",
        }
        account = verdict.to_json(coordinator, self.coordinator.policy.on_deadline)
        message = Message(b"", f"coordinator:{event_id}")
        self.metrics.coordinated.labels(verdict.action, verdict.why).inc()
        self._until_stored(lambda: self._act_on_verdict(decision, message, verdict, account), message)

    def _act_on_verdict(
        self, decision: dict[str, Any], message: Message, verdict: Verdict, account: dict[str, Any]
    ) -> None:
        earlier = self.store.get(decision["decisionId"])
        if earlier is not None and earlier["state"] == "final":
            return  # acted on already (the stream was read again after a restart)
        if verdict.action == "leave":
            detail = verdict.left_detail()
            self._finish(decision, message, "refused", "leftToPlatform", detail, [], coordination=account)
            return
        self.store.started(decision["decisionId"], message.position)
        body = {k: decision[k] for k in ("decisionId", "target", "issuedBy")}
        body.update(eventIds=[decision["eventId"]], coordination=account)
        answer, detail = self._relay(decision, body)
        self._finish_relayed(decision, message, answer, detail, coordination=account)

    # -- many decisions at once: lanes (bridge.approver.dispatch) ---------------------------------------

    def _drain_lane(self, lane: str, slots: list[Slot]) -> None:
        """Process one lane's batch: prepare each, relay the decisions to relay in one request, finish
        each. Anything unexpected for a message falls back to :meth:`_handle` (retries, poison
        handling, waiting for outbox room) for that message alone."""
        if self.stop_event.is_set():
            return  # not finished: not committed, read again after the restart
        prepared: list[tuple[Slot, dict[str, Any], dict[str, Any]]] = []
        later: list[Slot] = []
        ids: set[str] = set()
        for slot in slots:
            if _peek(slot.message, "decisionId") in ids:
                later.append(slot)  # the same decision twice in a batch: after the first is final
                continue
            try:
                result = self._prepare(slot.message, sync=False)  # the batch is synced below, once
            except Exception:
                self._settle(slot)
                continue
            if isinstance(result, tuple):
                prepared.append((slot, *result))
                ids.add(result[0]["decisionId"])
            else:
                self.commits.finished(slot)
        if prepared and self._synced([slot for slot, _, _ in prepared]):
            self._relay_and_finish(prepared)  # every "started" is durable before anything is relayed
        for slot in later:
            self._settle(slot)

    def _relay_and_finish(self, prepared: list[tuple[Slot, dict[str, Any], dict[str, Any]]]) -> None:
        for chunk in _chunks(prepared):
            try:
                results = self._relay_many([d for _, d, _ in chunk], [b for _, _, b in chunk])
            except Exception:
                log.exception("relaying a batch failed; each decision is retried on its own")
                for slot, _, _ in chunk:
                    self._settle(slot)
                continue
            done: list[tuple[Slot, dict[str, Any]]] = []
            for (slot, decision, _), (answer, detail) in zip(chunk, results, strict=True):
                try:
                    audit = self._finish_relayed(decision, slot.message, answer, detail, sync=False)
                except Exception:
                    self._settle(slot)  # waits for outbox room, or ends a poison message
                else:
                    done.append((slot, audit))
            # The chunk's audit records and outcomes durable (one sync each) before any is committed.
            if self._audits_synced(done) and self._synced([slot for slot, _ in done]):
                for slot, _ in done:
                    self.commits.finished(slot)

    def _audits_synced(self, done: list[tuple[Slot, dict[str, Any]]]) -> bool:
        """One fsync for a chunk's audit records. When it fails, the frames may be gone from the
        disk for good (Linux reports a failed writeback once and forgets the pages), so syncing again
        proves nothing: each audit record is appended again the durable way (same ``recordId``; a
        sink may see it twice), waiting for the disk as :meth:`_handle` does. False when stopping."""
        try:
            self.outbox.sync()
            return True
        except OutboxWriteError as exc:
            log.error("audit records cannot be synced; writing them again", extra={"error": str(exc)})
        for slot, audit in done:
            append = lambda a=audit: self.outbox.append(RecordMeta.of(a), records.encode(a))  # noqa: E731
            if not self._until_stored(append, slot.message):
                return False  # nothing committed: read again after the restart
        return True

    def _until_stored(self, store: Callable[[], Any], message: Message) -> bool:
        """Run ``store`` until the disk takes it (full, quota, failing: waited out with backoff, as
        :meth:`_handle` does); False when the approver stops first."""
        backoff = Backoff(base=1.0, cap=30.0)
        while not self.stop_event.is_set():
            try:
                store()
                self._outbox_streak.success()
                return True
            except (OutboxFull, OSError) as exc:
                self._outbox_streak.failure("outbox", f"not stored yet: {exc}", position=message.position)
            self.stop_event.wait(backoff.next_delay())
        return False

    def _synced(self, slots: list[Slot]) -> bool:
        """Sync the decision store for a lane's batch. When the disk refuses (EIO, ENOSPC), each
        message goes the one-at-a-time way instead (:meth:`_handle`: retried until the store can be
        written, never committed before): a batch must not be left neither finished nor retried,
        which would hold every later commit back."""
        try:
            self.store.sync()
            return True
        except OSError as exc:
            log.error(
                "decision store cannot be synced; retrying decision by decision", extra={"error": str(exc)}
            )
            for slot in slots:
                self._settle(slot)
            return False

    def _settle(self, slot: Slot) -> None:
        if self._handle(slot.message):
            self.commits.finished(slot)

    def _commit(self, messages: list[Message]) -> None:
        try:
            self.source.commit_many(messages)
        except SourceError as exc:  # a lost commit means a re-read, which the store recognises
            log.warning("commit failed; the decision may be read again", extra={"error": str(exc)})

    def _finish(
        self,
        decision: Any,
        message: Message,
        outcome: str,
        reason: str | None,
        detail: str | None,
        results: list[dict[str, Any]],
        *,
        relay: str | None = None,
        record_final: bool = True,
        sync: bool = True,
        path: str | None = None,
        arm_correlation_id: str | None = None,
        coordination: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        d = decision if isinstance(decision, dict) else {}

        def text(key: str) -> str | None:
            # Only what fits the decision schema's bounds reaches an audit record (a 5 MB decisionId
            # is refused, not stored or echoed).
            value = d.get(key)
            return value if isinstance(value, str) and 0 < len(value) <= AUDIT_FIELD_LIMITS[key] else None

        event_id = text("eventId")
        if not results and event_id:
            results = [{"eventId": event_id, "result": "refused", "detail": reason}]
        audit = records.approval_record(
            "approver" if coordination is None else "coordinator",
            decision_id=text("decisionId"),
            event_ids=[event_id] if event_id else [],
            target=text("target"),
            issued_by=text("issuedBy"),
            requester=relay,
            outcome=outcome if outcome in ("approved", "refused", "failed", "partial") else "failed",
            reason=reason,
            detail=(detail or None) and str(detail)[:500],
            results=[
                {
                    "eventId": r.get("eventId", ""),
                    "result": r.get("result", "refused"),
                    "detail": r.get("detail"),
                }
                for r in results
            ],
            path=path,
            arm_correlation_id=arm_correlation_id,
            coordination=coordination,
        )
        # Durable first, then the store, then (in the caller) the source commit: a crash anywhere
        # re-reads the message and ends with the same outcome. ``sync=False`` (a lane's chunk): the
        # caller syncs the outbox, then the store, before committing.
        self.outbox.append(RecordMeta.of(audit), records.encode(audit), sync=sync)
        if record_final and audit["decisionId"]:
            self.store.final(audit["decisionId"], message.position, audit["outcome"], reason, sync=sync)
        self.metrics.decisions.labels(audit["outcome"], reason or "ok").inc()
        level = logging.INFO if audit["outcome"] == "approved" else logging.WARNING
        log.log(
            level,
            f"decision {audit['outcome']}",
            extra={
                "decisionId": audit["decisionId"],
                "eventId": event_id,
                "reason": reason,
                "detail": audit["detail"],
                "relay": relay,
            },
        )
        return audit

    # -- the HTTP API: /healthz, /readyz, /metrics -----------------------------------------------------

    def serve(self, listen: str, *, read_token_file: str | None = None) -> None:
        """Bind ``listen`` now (a port in use is a start-up error); :meth:`run` starts serving.
        The same guard as the agent's API: no browsers, remote scrapes need the read token."""
        refused = self.metrics.http_refused
        guard = ApiGuard(
            listen,
            READ_PATHS,
            read_token_file=read_token_file,
            on_refused=lambda reason: refused.labels(reason).inc(),
        )
        self.api = Listener(
            listen,
            probe_routes(self.health.report, self.ready, self.metrics.registry),
            guard=guard,
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

    def ready(self) -> tuple[bool, str]:
        """Ready while the decisions source is open and reading it has not failed for long."""
        if self.health.fatal is not None:
            return False, f"component failed: {self.health.fatal}"
        if not self._source_open:
            return False, "decisions source not open yet"
        if self._streak.failures:
            failing = time.monotonic() - self._streak.since
            if failing > READY_MAX_FAILURE:
                return False, f"reading decisions failing for {failing:.0f} s"
        return True, "ok"

    # -- the loop ---------------------------------------------------------------------------------------

    def run(self, install_signals: bool = True) -> int:
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop_event.set())
        self._start_components()
        try:
            if not self._open_source():
                return 2
            self._consume()
        finally:
            self.shutdown()
        if self.health.fatal is not None:
            log.critical("approver stopped because a component failed", extra={"reason": self.health.fatal})
            return EXIT_COMPONENT_FAILED
        return 0

    def _start_components(self) -> None:
        decision_module.warm_up()
        for worker in self.workers:
            worker.open_at_start()
            worker.start()
        self.router.start(self.stop_event)
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
            try:
                messages = self.source.poll(0.5)
            except Exception as exc:  # a broken source must not end the approver: back off
                self._source_failed(exc)
                self.stop_event.wait(2.0)
                continue
            self._streak.success()
            self.metrics.source_ready.set(1)
            for message in messages:
                slot = self.commits.track(message)
                if not self.lanes.add(_lane_of(message), slot, self.stop_event):
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

    def _handle(self, message: Message) -> bool:
        """Process and commit one message (order is kept: the next message waits). A failure to store
        the outcome (disk full) is retried until it works; any other error is retried a few times and
        then ends the message as ``unprocessable``, audited and committed: a poison message must not
        hold every later decision back. Returns False when stopping before it was finished. The
        caller commits (in read order: :class:`~bridge.approver.dispatch.OrderedCommits`)."""
        backoff = Backoff(base=1.0, cap=30.0)
        errors = 0
        while True:
            try:
                if errors < POISON_ATTEMPTS:
                    self.process(message)
                else:
                    self._give_up(message)
                self._outbox_streak.success()
                break
            except (OutboxFull, OutboxWriteError) as exc:  # not the message's fault: wait for room
                self._outbox_streak.failure(
                    "outbox", f"audit record not admitted: {exc}", position=message.position
                )
            except Exception as exc:
                if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
                    # The decision store cannot be written (disk full, I/O error): not the message's
                    # fault either. Counted as a poison attempt, valid decisions were given up.
                    self._outbox_streak.failure(
                        "store", f"decision store not writable: {exc.strerror}", position=message.position
                    )
                    if self.stop_event.wait(backoff.next_delay()):
                        return False
                    continue
                errors += 1
                log.exception(
                    "decision could not be processed", extra={"position": message.position, "attempt": errors}
                )
            if self.stop_event.wait(backoff.next_delay()):
                return False
        return True

    def _give_up(self, message: Message) -> None:
        raw = _loads_object(message.payload) or {}
        decision_id = raw.get("decisionId") if isinstance(raw.get("decisionId"), str) else None
        started = decision_id is not None and self.store.get(decision_id) is not None
        # Once started it may have reached an agent: say "failed", not "refused" (the agent's own
        # audit record tells whether a StartRequest was posted).
        outcome = "failed" if started else "refused"
        detail = f"processing failed {POISON_ATTEMPTS} times; see the approver log"
        self._finish(raw, message, outcome, "unprocessable", detail, [], record_final=started)

    def close(self) -> None:
        """Release the state directory: the decision store, the outbox and the lock."""
        self.store.close()
        self.outbox.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def shutdown(self) -> None:
        self.stop_event.set()
        if self.api is not None:
            self.api.stop()
        self.lanes.close()  # lanes see the stop and leave unfinished decisions uncommitted
        self.commits.commit_ready()  # what did finish is committed (a re-read would be harmless)
        for worker in self.workers:
            worker.stop(10.0)
        for worker in self.workers:
            worker.join(15.0)
        self.source.close()
        self.close()
        log.info("approver stopped")


def build_approver(config: Any) -> Approver:
    """From an :class:`bridge.config.ApproverConfig` (flags, TOML, environment)."""
    from bridge.config import ConfigError
    from bridge.signing import KeyRing
    from bridge.sinks import SinkError, create_sink

    try:
        keys = KeyRing.from_specs(config.key)
        relay_keys = KeyRing.from_specs(config.relay_key)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not keys and not config.allow_unsigned:
        raise ConfigError(
            "key: at least one --key KEYID=PATH is required (or --allow-unsigned, for labs only)"
        )
    policy = ValidationPolicy(
        keys, config.allow_unsigned, frozenset(config.issuer), config.max_skew, config.max_ttl
    )
    state_dir = Path(config.state_dir)
    lock = lock_state_dir(state_dir)  # before any file in it is read, compacted or replaced
    relay = RelayClient(relay_keys, config.relay_timeout, config.relay_ca_file)
    if config.coordinate and config.mode != "fleet":
        raise ConfigError("coordinate: only a fleet approver coordinates (--mode fleet)")
    try:
        topology.check(config.mode, config.source)
        for spec in config.events_source:
            topology.check_events_reader(spec)
        group = topology.source_group(config.mode, config.source, config.group, state_dir)
        source = create_source(config.source, state_dir, group=group)
        sinks = [create_sink(spec) for spec in config.sink]
        if config.mode == "fleet":
            if not config.events_source:
                raise ConfigError("events_source: fleet mode needs --events-source (the events stream)")
            learn = [
                create_source(s, state_dir / "fleet", group=topology.events_group(s, config.group, state_dir))
                for s in config.events_source
            ]
            router: LocalRouter | FleetRouter = FleetRouter(learn, config.relay_url_template)
        else:
            router = LocalRouter(config.relay, relay)
    except (SinkError, SourceError, ValueError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    approver = Approver(
        source,
        router,
        relay,
        policy,
        sinks,
        state_dir,
        lock=lock,
        arm=_arm_acknowledger(config),
        arm_mode=config.arm,
        coordination_policy=(
            CoordinationPolicy(config.coordinate_deadline, config.coordinate_on_deadline)
            if config.coordinate
            else None
        ),
        instance=topology.instance_id(state_dir),
    )
    if config.listen:
        try:
            approver.serve(config.listen, read_token_file=config.read_token_file)
        except (OSError, ValueError) as exc:
            approver.close()
            raise ConfigError(f"listen: cannot serve on {config.listen}: {exc}") from None
    return approver


def _arm_acknowledger(config: Any) -> ArmAcknowledger | None:
    """The ARM path when ``--arm`` asks for it (its credential is built, nothing is contacted)."""
    if config.arm == "off":
        return None
    from bridge.config import ConfigError
    from bridge.transports.azure import check_client_id, make_credential
    from bridge.transports.base import Owner

    owner = Owner("arm", lambda message: ConfigError(message))
    client_id = check_client_id(owner, "arm_client_id", config.arm_client_id)
    credential = make_credential(owner, "arm_credential", config.arm_credential, client_id)
    return ArmAcknowledger(
        credential, config.arm_endpoint, config.arm_api_version, audience=config.arm_audience,
        ca_file=config.arm_ca_file, timeout=config.relay_timeout,
    )  # fmt: skip


def lock_state_dir(state_dir: Path) -> int | None:
    """Create the state directory (0700) and take its lock, or refuse to start (exit 2): a second
    approver on the same directory must stop before it touches the first one's files."""
    from bridge.config import ConfigError

    try:
        ensure_private_dir(state_dir)
        return lock_directory(state_dir)
    except DirectoryLocked as exc:
        raise ConfigError(f"state_dir: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"state_dir: cannot use {state_dir}: {exc.strerror}") from None


def _peek(message: Message, field: str) -> str | None:
    """A field of a message not validated yet (for routing only); a message too large to be a
    decision is not parsed here either."""
    decision = _loads_object(message.payload) if len(message.payload) <= MAX_MESSAGE_BYTES else None
    value = decision.get(field) if decision else None
    return value if isinstance(value, str) else None


def _lane_of(message: Message) -> str:
    """The lane of a message: its target VM (case-insensitive); unreadable messages share one lane."""
    return (_peek(message, "target") or "").lower()


def _chunks(prepared: list[Any]) -> list[list[Any]]:
    """Relay requests of at most ``LANE_BATCH`` decisions and ``MAX_RELAY_BYTES``."""
    out: list[list[Any]] = [[]]
    size = 0
    for item in prepared:
        item_size = len(orjson.dumps(item[2]))
        if out[-1] and (len(out[-1]) >= LANE_BATCH or size + item_size > MAX_RELAY_BYTES):
            out.append([])
            size = 0
        out[-1].append(item)
        size += item_size
    return out


def _loads_object(payload: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
