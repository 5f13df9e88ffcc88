"""The life of one decision in an approver, from the message read to its commit.

One sequence, whether a decision travels alone (:meth:`DecisionLife.process`, the retrying way of
:meth:`DecisionLife.handle`) or in a lane's batch with the other decisions for its VM
(:meth:`DecisionLife.drain_lane`, one relay request and one sync for the lot):

    validate -> store "started" -> relay -> audit record -> store final -> commit

1. validate (:mod:`bridge.approver.decision`): anything not proven valid is refused and audited,
   what it claims of itself kept apart (``unverified``); a decision for another VM is skipped;
2. the decision store: a decision id already final is a replay (refused), unless it is the very
   same message read again after a crash (then it is only committed); otherwise it is "started",
   durably, before anything is relayed;
3. relay (:mod:`bridge.approver.relaying`: the VM's agent, its siblings, the ARM path): the agent
   checks that the event still waits for approval and posts the StartRequest once per decision; a
   decision no agent answered waits, uncommitted, in the parking and is relayed again until an
   agent answers or it expires;
4. the audit record and the final outcome (:mod:`bridge.approver.auditing`), durable;
5. the commit, in read order per partition (:class:`~bridge.approver.dispatch.OrderedCommits`).

A message whose processing raises is retried a few times, then ends ``unprocessable``, audited: a
poison message must not hold every later decision back. A full or failing disk is not the message's
fault: it is waited out.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from typing import Any

import orjson

from bridge.approver.auditing import AuditWriter, claims_of
from bridge.approver.decision import DecisionRefused, ValidationPolicy, expires_at, loads_strict, validate
from bridge.approver.dispatch import Claims, Lanes, OrderedCommits, Parking, Slot
from bridge.approver.messages import MAX_MESSAGE_BYTES, lane_of, loads_object, peek
from bridge.approver.metrics import ApproverMetrics
from bridge.approver.relaying import Relayer, Unreached
from bridge.approver.routing import FleetRouter, LocalRouter
from bridge.approver.sources import Message
from bridge.approver.store import DecisionStore
from bridge.observability import RateLimitedLog
from bridge.pipeline import OutboxFull, OutboxWriteError
from bridge.relay_api import RelayDecision
from bridge.retry import Backoff

log = logging.getLogger("bridge.approver.service")  # one logger name for the approver's decisions

#: Attempts at a message whose processing raises before it is refused as ``unprocessable``.
POISON_ATTEMPTS = 3
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

Prepared = tuple[Slot, dict[str, Any], dict[str, Any]]  # a message, its decision, its relay body


class DecisionLife:
    """Takes decisions from their message to their commit (module docstring)."""

    def __init__(
        self,
        *,
        policy: ValidationPolicy,
        router: LocalRouter | FleetRouter,
        relayer: Relayer,
        store: DecisionStore,
        audit: AuditWriter,
        commits: OrderedCommits,
        metrics: ApproverMetrics,
        stop_event: threading.Event,
    ) -> None:
        self.policy = policy
        self.router = router
        self.relayer = relayer
        self.store = store
        self.audit = audit
        self.commits = commits
        self.metrics = metrics
        self.stop_event = stop_event
        self.lanes = Lanes(
            self.drain_lane,
            workers=LANE_WORKERS,
            max_in_flight=MAX_IN_FLIGHT,
            batch=LANE_BATCH,
            per_lane=PER_LANE,
        )
        self.claims = Claims()
        self.parking = Parking(self.resubmit, self.expire_parked)
        self._parked_log = RateLimitedLog(log, every=10.0, level=logging.WARNING)
        self._skipped_log = RateLimitedLog(log, every=60.0)

    def add(self, message: Message, slot: Slot | None = None) -> bool:
        """Hand a message to its VM's lane; False when stopping before there was room."""
        return self.lanes.add(lane_of(message), slot or Slot(message), self.stop_event)

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
        answer, unreached = self.relay(decision, body, fallback=self._may_fall_back([slot]))
        if answer is None:
            assert unreached is not None
            self._park(slot, decision, unreached)
            return None
        return self.finish_relayed(decision, message, answer)

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
                return self.audit.finish(
                    raw, message, "refused", refusal.reason, refusal.detail, [], record_final=False
                )
            return self.audit.finish(
                None, message, "refused", refusal.reason, refusal.detail, [], record_final=False,
                unverified=claims_of(raw),
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
            return self.audit.finish(decision, message, "refused", "replayed", detail, [], record_final=False)
        if decision["action"] == "decline":  # a person said no: audited, nothing relayed
            detail = f"declined by {decision['issuedBy']}: the platform starts the event at NotBefore"
            return self.audit.finish(decision, message, "refused", "declined", detail, [])
        self.store.started(decision_id, message.position, sync=sync)
        body = RelayDecision(
            decision_id,
            (decision["eventId"],),
            target=decision["target"],
            issued_by=decision["issuedBy"],
            expires_at=decision["expiresAt"],  # the agent checks it too: relaying may take a while
        ).to_json()
        return decision, body

    def finish_relayed(
        self,
        decision: dict[str, Any],
        message: Message,
        answer: dict[str, Any],
        *,
        sync: bool = True,
        coordination: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self.audit.finish(
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

    def relay(
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

    def resubmit(self, slot: Slot) -> bool:
        self.metrics.parked.set(self.parking.count)
        return self.lanes.add(lane_of(slot.message), slot, self.stop_event)

    def expire_parked(self, slot: Slot) -> None:
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
        finish = lambda: self.audit.finish(decision, slot.message, outcome, "expired", detail, [])  # noqa: E731
        if self.audit.until_stored(finish, slot.message) is not None:
            self.commits.finished(slot)
        self.metrics.parked.set(self.parking.count)

    # -- many decisions at once: lanes (bridge.approver.dispatch) ---------------------------------------

    def drain_lane(self, lane: str, slots: list[Slot]) -> None:
        """Process one lane's batch: prepare each, relay the decisions to relay in one request, finish
        each. Anything unexpected for a message falls back to :meth:`handle` (retries, poison
        handling, waiting for outbox room) for that message alone."""
        if self.stop_event.is_set():
            return  # not finished: not committed, read again after the restart
        prepared: list[Prepared] = []
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

    def _prepare_into(self, slot: Slot, prepared: list[Prepared]) -> None:
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

    def _relay_and_finish(self, prepared: list[Prepared]) -> None:
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
                    audit = self.finish_relayed(decision, slot.message, answer, sync=False)
                except Exception:
                    self._settle(slot)  # waits for outbox room, or ends a poison message
                else:
                    done.append((slot, audit))
            # The chunk's audit records and outcomes durable (one sync each) before any is committed.
            if self.audit.synced(done) and self._synced([slot for slot, _ in done]):
                for slot, _ in done:
                    self.commits.finished(slot)

    def _synced(self, slots: list[Slot]) -> bool:
        """Sync the decision store for a lane's batch. When the disk refuses (EIO, ENOSPC), each
        message goes the one-at-a-time way instead (:meth:`handle`: retried until the store can be
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
        if self.handle(slot):
            self.commits.finished(slot)

    def handle(self, slot: Slot) -> bool:
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
                self.audit.streak.success()
                break
            except (OutboxFull, OutboxWriteError) as exc:  # not the message's fault: wait for room
                self.audit.streak.failure(
                    "outbox", f"audit record not admitted: {exc}", position=message.position
                )
            except Exception as exc:
                if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
                    # The decision store cannot be written (disk full, I/O error): not the message's
                    # fault either. Counted as a poison attempt, valid decisions were given up.
                    self.audit.streak.failure(
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
        self.audit.finish(raw, message, outcome, "unprocessable", detail, [], record_final=started)


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
