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

Around it: :mod:`bridge.approver.build` makes an approver from its configuration,
:mod:`bridge.approver.relaying` carries decisions to an agent (failover, ARM),
:mod:`bridge.approver.dispatch` runs the per-VM lanes and keeps commits in order,
:mod:`bridge.approver.messages` reads a message before it is validated, and
:mod:`bridge.approver.metrics` holds the approver's series.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, get_args

import orjson

from bridge import __version__, coordination, records
from bridge.apiguard import ApiGuard
from bridge.approver import decision as decision_module
from bridge.approver.arm import ArmAcknowledger
from bridge.approver.coordinator import FleetCoordinator
from bridge.approver.decision import DecisionRefused, ValidationPolicy, expires_at, loads_strict, validate
from bridge.approver.dispatch import Claims, Lanes, OrderedCommits, Parking, Slot
from bridge.approver.messages import MAX_MESSAGE_BYTES, lane_of, loads_object, peek
from bridge.approver.metrics import ApproverMetrics
from bridge.approver.relaying import Relayer, Unreached
from bridge.approver.routing import FleetRouter, LocalRouter, RelayClient
from bridge.approver.sources import DecisionSource, Message, SourceError
from bridge.approver.standby import Standby
from bridge.approver.store import DecisionStore, lock_state_dir
from bridge.coordination import CoordinationPolicy, Verdict
from bridge.errors import BridgeError
from bridge.fsutil import lock_lost, watch_lock
from bridge.listener import Listener, probe_routes
from bridge.observability import ErrorStreak, RateLimitedLog
from bridge.pipeline import (
    DeliveryWorker,
    Health,
    Outbox,
    OutboxFull,
    OutboxLocked,
    OutboxWriteError,
    RecordMeta,
)
from bridge.relay_api import Outcome, RelayDecision, fits
from bridge.retry import Backoff
from bridge.sinks import Sink

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Attempts at a message whose processing raises before it is refused as ``unprocessable``.
POISON_ATTEMPTS = 3
#: The outcomes an approver's audit record may carry (approval.v1 schema); anything else is "failed".
AUDIT_OUTCOMES = frozenset(get_args(Outcome))


#: Lanes (VMs) processed at once, messages read and not finished, decisions per relay request
#: (bridge.approver.dispatch); a relay request also stays below the agent's 64 KiB body limit.
LANE_WORKERS = 16
MAX_IN_FLIGHT = 1024
LANE_BATCH = 50
#: Batches of one VM in flight at once: a decision need not wait for the previous one's answer
#: (the agent coalesces concurrent requests into one StartRequests per IMDS slot).
PER_LANE = 4
MAX_RELAY_BYTES = 32 * 1024

#: What a state directory's file system answers when it cannot keep a write (full, quota, failing,
#: read-only): the decision waits for the disk, it is never counted as a poison attempt.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})

#: Rounds without an agent before the ARM fallback may be taken (about 1.5 s with the parking's backoff).
ARM_AFTER = 3
#: Longest wait between two tries of a parked decision (a restarted agent is reached within it).
PARKED_MAX_DELAY = 2.0
#: Parked decisions at most; reading waits beyond (memory stays bounded while agents are down).
MAX_PARKED = 10_000

#: The approver is not ready once reading decisions has failed for this long (a broker blip is not).
READY_MAX_FAILURE = 30.0
#: The approver's own read path: ``/metrics`` names its sinks and sources, so remote scrapers need
#: the read token (``/healthz`` and ``/readyz`` stay open for probes).
READ_PATHS = frozenset({"/metrics"})

#: Exit code when a component failed for good (EX_SOFTWARE): the service manager restarts the approver.
EXIT_COMPONENT_FAILED = 70


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
    ) -> None:
        self.source = source
        self.router = router
        self.policy = policy
        self.metrics = metrics or ApproverMetrics()
        self.metrics.ownership.source = source
        if isinstance(router, FleetRouter):
            self.metrics.fleet.counts = router.view.counts
            refused = self.metrics.fleet_claims_refused
            router.view.on_refused = lambda reason: refused.labels(reason).inc()
        self.stop_event = threading.Event()
        self.health = Health(self.metrics, on_fatal=lambda _why: self.stop_event.set())
        self._lock_fd = lock if lock is not None else lock_state_dir(state_dir)
        self.state_dir = state_dir
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
        self.relayer = Relayer(
            router, relay, attempts=relay_attempts, stop_event=self.stop_event, arm=arm, arm_mode=arm_mode
        )
        self.commits = OrderedCommits(self._commit)
        self.lanes = Lanes(
            self._drain_lane,
            workers=LANE_WORKERS,
            max_in_flight=MAX_IN_FLIGHT,
            batch=LANE_BATCH,
            per_lane=PER_LANE,
        )
        self.claims = Claims()
        self.parking = Parking(self._resubmit, self._expire_parked)
        self._parked_log = RateLimitedLog(log, every=10.0, level=logging.WARNING)
        self.api: Listener | None = None
        self._source_open = False
        self._streak = ErrorStreak(log, f"reading decisions from {source.name}")
        self._outbox_streak = ErrorStreak(log, "storing decisions and audit records")
        self._skipped_log = RateLimitedLog(log, every=60.0)
        self.coordinator: FleetCoordinator | None = None
        if coordination_policy is not None:
            if not isinstance(router, FleetRouter):
                raise ValueError("only a fleet approver coordinates")
            self.coordinator = FleetCoordinator(
                coordination_policy, runs_agent=router.knows, leader=source.leads, act=self.coordinated
            )
            router.observers.append(self.coordinator.observe)
        self.instance = instance or "approver"
        self.standby = self._build_standby(state_dir, standby_after)

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
            if not self.lanes.add(lane_of(message), Slot(message), self.stop_event):
                return

    # -- one decision ---------------------------------------------------------------------------------

    def process(
        self, message: Message, now: float | None = None, slot: Slot | None = None
    ) -> dict[str, Any] | None:
        """Take one message to a final outcome and publish its audit record. Returns the audit, or
        None when no agent answered: the decision then waits in the parking (uncommitted) and is
        relayed again later, until an agent answers or it expires."""
        prepared = self._prepare(message, now)
        if not isinstance(prepared, tuple):
            return prepared
        decision, body = prepared
        slot = slot or Slot(message)
        answer, unreached = self._relay(decision, body, fallback=self._may_fall_back([slot]))
        if answer is None:
            assert unreached is not None
            self._park(slot, decision, unreached)
            return None
        return self._finish_relayed(decision, message, answer)

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
            # A message never proven to be a decision does not speak for one: what it claims goes
            # under "unverified" (never as the audit's decisionId), and one too large is not parsed.
            raw = loads_object(message.payload) if refusal.reason != "tooLarge" else None
            if refusal.authentic:
                return self._finish(
                    raw, message, "refused", refusal.reason, refusal.detail, [], record_final=False
                )
            return self._finish(
                None, message, "refused", refusal.reason, refusal.detail, [], record_final=False,
                unverified=_claims(raw),
            )  # fmt: skip
        if not self.router.owns(decision):
            # Another VM's approver acts on it (local mode): no audit here, but never unseen, since a
            # target no VM has is skipped by every approver (one line a minute, with the count).
            self.metrics.skipped.labels("otherVm").inc()
            self._skipped_log.log(
                "decision for another VM skipped (its own approver acts on it)",
                decisionId=decision["decisionId"],
                target=decision["target"],
                thisVm=sorted(self.router.this_vm() or ()) if isinstance(self.router, LocalRouter) else None,
            )
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
        if decision["action"] == "decline":  # a person said no: audited, nothing relayed
            detail = f"declined by {decision['issuedBy']}: the platform starts the event at NotBefore"
            return self._finish(decision, message, "refused", "declined", detail, [])
        self.store.started(decision_id, message.position, sync=sync)
        body = RelayDecision(
            decision_id,
            (decision["eventId"],),
            target=decision["target"],
            issued_by=decision["issuedBy"],
            expires_at=decision["expiresAt"],  # the agent checks it too: relaying may take a while
        ).to_json()
        return decision, body

    def _finish_relayed(
        self,
        decision: dict[str, Any],
        message: Message,
        answer: dict[str, Any],
        *,
        sync: bool = True,
        coordination: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
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
        decision = loads_object(message.payload)
        if decision is None:
            raise DecisionRefused("schema", "message is not a JSON object")
        try:
            loads_strict(message.payload)  # I-JSON: no member twice (bridge.approver.decision)
        except ValueError as exc:
            raise DecisionRefused("schema", f"not I-JSON: {exc}") from None
        try:
            return validate(decision, self.policy, now)
        except DecisionRefused:
            raise
        except Exception as exc:  # a check that could not run proves nothing: refuse
            raise DecisionRefused("schema", f"cannot be validated: {type(exc).__name__}: {exc}") from None

    def _relay(
        self, decision: dict[str, Any], body: dict[str, Any], *, fallback: bool = True
    ) -> tuple[dict[str, Any] | None, Unreached | None]:
        return self.relayer.relay([decision], [body], fallback=fallback)[0]

    # -- decisions no agent answered: parked, retried, or ended at their expiry --------------------

    def _may_fall_back(self, slots: list[Slot]) -> bool:
        """Whether the ARM fallback may be taken in this round: after ``ARM_AFTER`` rounds without an
        agent, none of which can have reached one (else the agent may have posted already)."""
        return all(not s.maybe_sent and s.unreached + 1 >= ARM_AFTER for s in slots)

    def _park(self, slot: Slot, decision: dict[str, Any], unreached: Unreached) -> None:
        """No agent answered: keep the decision, uncommitted, and relay it again after a backoff
        (0.5 s doubling to ``PARKED_MAX_DELAY``), until an agent answers or the decision expires."""
        slot.unreached += 1
        slot.maybe_sent = slot.maybe_sent or not unreached.never_sent
        slot.unreached_since = slot.unreached_since or time.time()
        delay = min(PARKED_MAX_DELAY, 0.5 * 2 ** (slot.unreached - 1)) * random.uniform(0.8, 1.0)
        self.parking.park(slot, delay, expires_at(decision))
        self.metrics.parked.set(self.parking.count)
        self._parked_log.log(
            "decision waits for an agent of its event (not committed; retried until it expires)",
            decisionId=decision["decisionId"],
            target=decision["target"],
            attempts=slot.unreached,
            retryInSeconds=round(delay, 2),
            error=unreached.why,
        )

    def _resubmit(self, slot: Slot) -> bool:
        self.metrics.parked.set(self.parking.count)
        return self.lanes.add(lane_of(slot.message), slot, self.stop_event)

    def _expire_parked(self, slot: Slot) -> None:
        """A parked decision expired before any agent answered: its one final outcome. ``failed``
        when provably no request reached an agent (nothing was posted), ``unknown`` when one may
        have (connected, no answer: the agent's ledger and audit tell)."""
        decision = loads_object(slot.message.payload) or {}
        outcome = "unknown" if slot.maybe_sent else "failed"
        since = slot.unreached_since or time.time()
        detail = (
            f"no agent of the event answered in {slot.unreached} attempts over {time.time() - since:.0f} s "
            f"before the decision expired{'; one may have reached an agent' if slot.maybe_sent else ''}"
        )
        finish = lambda: self._finish(decision, slot.message, outcome, "expired", detail, [])  # noqa: E731
        if self._until_stored(finish, slot.message) is not None:
            self.commits.finished(slot)
        self.metrics.parked.set(self.parking.count)

    # -- coordinated approval (bridge.approver.coordinator) ---------------------------------------------

    def coordinated(self, event_id: str, members: list[str], verdict: Verdict) -> bool:
        """Act on the fleet coordinator's verdict for one event: approve it through an agent of the
        event (the decision store makes it once per event id), or audit that the platform decides.
        A full or failing disk is waited out: a verdict is never dropped (until the approver stops).
        False when no agent of the event answered: nothing is recorded or audited, and the
        coordinator tries again later (a relay request that never arrived approved nothing)."""
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
        done = self._until_stored(lambda: self._act_on_verdict(decision, message, verdict, account), message)
        if done is None:
            return True  # stopping: the next coordinator assesses the event again
        if done:
            self.metrics.coordinated.labels(verdict.action, verdict.why).inc()
        return done

    def _act_on_verdict(
        self, decision: dict[str, Any], message: Message, verdict: Verdict, account: dict[str, Any]
    ) -> bool:
        earlier = self.store.get(decision["decisionId"])
        if earlier is not None and earlier["state"] == "final":
            return True  # acted on already (the stream was read again after a restart)
        if verdict.action == "leave":
            detail = verdict.left_detail()
            self._finish(decision, message, "refused", "leftToPlatform", detail, [], coordination=account)
            return True
        self.store.started(decision["decisionId"], message.position)
        body = RelayDecision(
            decision["decisionId"],
            (decision["eventId"],),
            target=decision["target"],
            issued_by=decision["issuedBy"],
            coordination=account,
        ).to_json()
        answer, unreached = self._relay(decision, body)
        if answer is None:
            log.warning(
                "coordinated approval reached no agent of the event; trying again later",
                extra={"eventId": decision["eventId"], "error": str(unreached)},
            )
            return False
        self._finish_relayed(decision, message, answer, coordination=account)
        return True

    # -- many decisions at once: lanes (bridge.approver.dispatch) ---------------------------------------

    def _drain_lane(self, lane: str, slots: list[Slot]) -> None:
        """Process one lane's batch: prepare each, relay the decisions to relay in one request, finish
        each. Anything unexpected for a message falls back to :meth:`_handle` (retries, poison
        handling, waiting for outbox room) for that message alone."""
        if self.stop_event.is_set():
            return  # not finished: not committed, read again after the restart
        prepared: list[tuple[Slot, dict[str, Any], dict[str, Any]]] = []
        later: list[tuple[Slot, str]] = []
        claimed: list[str] = []
        try:
            for slot in slots:
                decision_id = peek(slot.message, "decisionId")
                if decision_id is not None and not self.claims.claim(decision_id):
                    later.append((slot, decision_id))  # another worker has this id: after it is final
                    continue
                if decision_id is not None:
                    claimed.append(decision_id)
                self._prepare_into(slot, prepared)
            if prepared and self._synced([slot for slot, _, _ in prepared]):
                self._relay_and_finish(prepared)  # every "started" is durable before anything is relayed
        finally:
            for decision_id in claimed:
                self.claims.release(decision_id)
        for slot, decision_id in later:
            if self.claims.wait_released(decision_id, self.stop_event):
                self._settle(slot)

    def _prepare_into(self, slot: Slot, prepared: list[tuple[Slot, dict[str, Any], dict[str, Any]]]) -> None:
        """Prepare one message of a lane batch: to relay (``prepared``), finished, or on its own."""
        try:
            result = self._prepare(slot.message, sync=False)  # the batch is synced by the caller, once
        except Exception:
            self._settle(slot)
            return
        if isinstance(result, tuple):
            prepared.append((slot, *result))
        else:
            self.commits.finished(slot)

    def _relay_and_finish(self, prepared: list[tuple[Slot, dict[str, Any], dict[str, Any]]]) -> None:
        for chunk in _chunks(prepared):
            fallback = self._may_fall_back([slot for slot, _, _ in chunk])
            try:
                results = self.relayer.relay(
                    [d for _, d, _ in chunk], [b for _, _, b in chunk], fallback=fallback
                )
            except Exception:
                log.exception("relaying a batch failed; each decision is retried on its own")
                for slot, _, _ in chunk:
                    self._settle(slot)
                continue
            done: list[tuple[Slot, dict[str, Any]]] = []
            for (slot, decision, _), (answer, unreached) in zip(chunk, results, strict=True):
                if answer is None:
                    assert unreached is not None
                    self._park(slot, decision, unreached)  # its "started" is durable already
                    continue
                try:
                    audit = self._finish_relayed(decision, slot.message, answer, sync=False)
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
            if self._until_stored(append, slot.message) is None:
                return False  # nothing committed: read again after the restart
        return True

    def _until_stored(self, store: Callable[[], T], message: Message) -> T | None:
        """Run ``store`` until the disk takes it (full, quota, failing: waited out with backoff, as
        :meth:`_handle` does) and return what it returned; None when the approver stops first (so
        ``store`` must not return None itself)."""
        backoff = Backoff(base=1.0, cap=30.0)
        while not self.stop_event.is_set():
            try:
                result = store()
                self._outbox_streak.success()
                return result
            except (OutboxFull, OSError) as exc:
                self._outbox_streak.failure("outbox", f"not stored yet: {exc}", position=message.position)
            self.stop_event.wait(backoff.next_delay())
        return None

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
        if self._handle(slot):
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
        unverified: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        d = decision if isinstance(decision, dict) else {}

        def text(key: str) -> str | None:
            # Only what fits the decision schema's bounds reaches an audit record (a 5 MB decisionId
            # is refused, not stored or echoed).
            value = d.get(key)
            return value if fits(key, value) else None

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
            outcome=outcome if outcome in AUDIT_OUTCOMES else "failed",
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
            unverified=unverified,
            # One record per decision whichever instance writes it (bridge.approver.standby).
            record_id=records.approver_record_id(
                text("decisionId") if record_final else None, message.position, message.payload
            ),
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

    def lock_lost(self) -> str | None:
        """Why the state directory's lock no longer guards it, or None (bridge.fsutil.lock_lost)."""
        return lock_lost(self._lock_fd, self.state_dir)

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
        if self.standby is not None:
            threading.Thread(
                target=self.standby.run, args=(self.stop_event,), name="standby", daemon=True
            ).start()
        threading.Thread(
            target=self.parking.run, args=(self.stop_event,), name="parking", daemon=True
        ).start()
        # A state directory deleted under a running approver (issue 23): it would go on writing into
        # unlinked files, and a second approver could start on the same path. Stop (exit 70).
        watch_lock(self.lock_lost, lambda why: self.health.failed("stateDir", why), self.stop_event)
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
            if self.parking.count >= MAX_PARKED:  # agents away: hold reading, keep committing
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
                if not self.lanes.add(lane_of(message), slot, self.stop_event):
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

    def _handle(self, slot: Slot) -> bool:
        """Process one message to its end. A failure to store the outcome (disk full) is retried
        until it works; any other error is retried a few times and then ends the message as
        ``unprocessable``, audited: a poison message must not hold every later decision back.
        True when the message is final (the caller commits, in read order:
        :class:`~bridge.approver.dispatch.OrderedCommits`); False when stopping before that, or when
        it waits in the parking for an agent."""
        message = slot.message
        backoff = Backoff(base=1.0, cap=30.0)
        errors = 0
        while True:
            try:
                if errors < POISON_ATTEMPTS:
                    if self.process(message, slot=slot) is None:
                        return False  # parked: relayed again later, committed once final
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
        raw = loads_object(message.payload) or {}
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


def _claims(raw: dict[str, Any] | None) -> dict[str, str] | None:
    """What an unproven message says of itself, bounded as the decision schema bounds it: the
    audit's ``unverified`` part (to find the real decision it may imitate), never its identity."""
    if raw is None:
        return None
    out: dict[str, str] = {}
    for key in ("decisionId", "eventId", "target", "issuedBy"):
        value = raw.get(key)
        if isinstance(value, str) and fits(key, value):
            out[key] = value
    return out or None


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
