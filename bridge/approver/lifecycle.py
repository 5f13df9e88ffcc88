"""The life of one decision in an approver, from the message read to its commit.

One sequence (:meth:`DecisionLife.live`) for a lane's batch of the decisions for one VM (one relay
request and one sync for the lot) and for a decision alone (:meth:`DecisionLife.process`, a batch of
one: the retrying way of :meth:`DecisionLife.handle`, where a failure is raised, not sent on):

    validate -> store "started" (one sync) -> relay -> audit records -> store final (one sync) -> commit

1. validate (:mod:`bridge.decisions`): anything not proven valid is refused and audited,
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
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from bridge.approver.auditing import AuditWriter, Ending, claims_of
from bridge.approver.dispatch import Claims, Lanes, OrderedCommits, Parking, Slot
from bridge.approver.messages import MAX_MESSAGE_BYTES, lane_of, peek
from bridge.approver.metrics import ApproverMetrics
from bridge.approver.relaying import Relayer, Unreached
from bridge.approver.routing import FleetRouter, LocalRouter
from bridge.approver.store import DecisionStore
from bridge.decisions import Decision, DecisionRefused, ValidationPolicy, loads_strict, validate
from bridge.pipeline import OutboxFull, OutboxWriteError
from bridge.relay_api import RelayAnswer, RelayDecision
from bridge.schemas import JsonObject
from bridge.streams import Message
from bridge.support.observability import RateLimitedLog
from bridge.support.retry import Backoff

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
#: More rounds the standby's copy waits before ARM (about 8 s more): the owner, alive, takes the ARM
#: path first and commits, and the standby drops its copy; acting at once too acknowledged every such
#: approval twice through ARM, 0.8-1.0 s apart, with two audits (issue 33).
STANDBY_ARM_EXTRA = 4
#: Longest wait between two tries of a parked decision (a restarted agent is reached within it).
PARKED_MAX_DELAY = 2.0

Result = JsonObject  # a message's final result: its audit record, or a skip / re-read


@dataclass(frozen=True, slots=True)
class Prepared:
    """A message validated and stored as started: what is relayed for it."""

    index: int  # in its batch
    slot: Slot
    decision: Decision
    body: JsonObject  # the relay request's entry (bridge.relay_api.RelayDecision)


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
        owner_finished: Callable[[Message], bool] = lambda _message: False,
    ) -> None:
        # Whether the instance that owns a message (the standby acts on its copy) has finished it:
        # the standby then drops its copy, never audits it, never acknowledges it through ARM.
        self.owner_finished = owner_finished
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
        self.parked = ParkedDecisions(self)
        self.parking = self.parked.parking

    def add(self, message: Message, slot: Slot | None = None) -> bool:
        """Hand a message to its VM's lane; False when stopping before there was room."""
        slot = slot or Slot(message)
        return self.lanes.add(lane_of(slot.fields), slot, self.stop_event)

    # -- the one sequence ------------------------------------------------------------------------------

    def process(self, message: Message, now: float | None = None, slot: Slot | None = None) -> Result | None:
        """Take one message to its final outcome: a batch of one whose failures are raised to the
        caller (:meth:`handle` retries them). Returns the final result (the caller commits), or None
        when no agent answered: the decision then waits in the parking (uncommitted) and is relayed
        again later, until an agent answers or it expires."""
        return self.live([slot or Slot(message)], now, alone=True)[0]

    def live(
        self, slots: list[Slot], now: float | None = None, *, alone: bool = False
    ) -> list[Result | None]:
        """Validate and store as started each message (one sync), relay the decisions (one request
        per chunk), audit each and store its outcome (one sync), and return each message's final
        result for the caller to commit; None for one parked, or sent on its own way.

        ``alone`` (a batch of one, :meth:`process`): a failure is raised. Otherwise a message whose
        step fails goes the one-at-a-time way (:meth:`_settle`: retried, waited for the disk, or
        ended ``unprocessable``) and the others carry on without it."""
        results: dict[int, Result] = {}
        prepared: list[Prepared] = []
        for index, slot in enumerate(slots):
            try:
                step = self._prepare(slot, now)
            except Exception:
                if alone:
                    raise
                self._settle(slot)
                continue
            if isinstance(step, Prepared):
                prepared.append(Prepared(index, slot, step.decision, step.body))
            else:
                results[index] = step
        # Every "started" durable before anything is relayed.
        if prepared and self._synced([p.slot for p in prepared], alone):
            for chunk in _chunks(prepared):
                results.update(self._relay_and_finish(chunk, alone))
        return [results.get(index) for index in range(len(slots))]

    def _prepare(self, slot: Slot, now: float | None) -> Result | Prepared:
        """Everything before the relay: the final result (a refusal, a skip, a re-read) or the
        validated decision, stored as started (not synced: :meth:`live` syncs the batch once), and
        its relay request.

        Everything about the message is proven before anything is stored: only a decision that
        passed every check claims its ``decisionId`` (an unsigned or malformed message cannot burn
        the id of the real decision that follows it)."""
        message = slot.message
        try:
            decision = validated(slot, self.policy, time.time() if now is None else now)
        except DecisionRefused as refusal:
            return self._refused(slot, refusal)
        if not self.router.owns(decision):
            return _skipped(decision, self.router, self.metrics)
        earlier = self.store.get(decision.decision_id)
        if earlier is not None and earlier.state == "final":
            if earlier.position == str(message.position):
                log.info(
                    "decision already final (re-read after a restart)",
                    extra={"decisionId": decision.decision_id},
                )
                return {"outcome": earlier.outcome, "reason": earlier.reason, "reread": True}
            ending = Ending("refused", "replayed", f"decision id already used ({earlier.outcome})")
            return self.audit.finish(decision, message, ending, record_final=False)
        if decision.action == "decline":  # a person said no: audited, nothing relayed
            detail = f"declined by {decision.issued_by}: the platform starts the event at NotBefore"
            return self.audit.finish(decision, message, Ending("refused", "declined", detail))
        self.store.started(decision.decision_id, message.position, sync=False)
        body = RelayDecision(
            decision.decision_id,
            (decision.event_id,),
            target=decision.target,
            issued_by=decision.issued_by,
            expires_at=decision.expires_at,  # the agent checks it too: relaying may take a while
            proof=dict(decision.proof) if decision.proof is not None else None,  # proven again there
        ).to_json()
        return Prepared(0, slot, decision, body)

    def _refused(self, slot: Slot, refusal: DecisionRefused) -> Result:
        """A message not proven valid: audited, never stored as a decision. One never proven to be
        a decision does not speak for one: what it claims goes under ``unverified`` (never as the
        audit's decisionId)."""
        ending = Ending("refused", refusal.reason, refusal.detail)
        if refusal.authentic:
            return self.audit.finish(slot.fields, slot.message, ending, record_final=False)
        return self.audit.finish(
            None, slot.message, ending, record_final=False, unverified=claims_of(slot.fields)
        )

    def _relay_and_finish(self, chunk: list[Prepared], alone: bool) -> dict[int, Result]:
        """One relay request for a chunk, each answer audited, one sync; the final results."""
        try:
            answers = self.relayer.relay(
                [p.decision for p in chunk],
                [p.body for p in chunk],
                fallback=self.parked.may_fall_back(chunk),
            )
        except Exception:
            if alone:
                raise
            log.exception("relaying a batch failed; each decision is retried on its own")
            for p in chunk:
                self._settle(p.slot)
            return {}
        done: list[tuple[Prepared, Result]] = []
        for p, (answer, unreached) in zip(chunk, answers, strict=True):
            if answer is None:
                assert unreached is not None
                self.parked.park(p.slot, p.decision, unreached)  # its "started" is durable already
                continue
            try:
                done.append((p, self.finish_relayed(p.decision, p.slot.message, answer, sync=False)))
            except Exception:
                if alone:
                    raise
                self._settle(p.slot)  # waits for outbox room, or ends a poison message
        # The chunk's audit records and outcomes durable (one sync each) before any is committed.
        if self.audit.synced([(p.slot, audit) for p, audit in done]) and self._synced(
            [p.slot for p, _ in done], alone
        ):
            return {p.index: audit for p, audit in done}
        return {}

    def finish_relayed(
        self,
        decision: Decision,
        message: Message,
        answer: RelayAnswer,
        *,
        sync: bool = True,
        coordination: JsonObject | None = None,
    ) -> Result:
        ending = Ending.of_answer(answer)
        return self.audit.finish(decision, message, ending, sync=sync, coordination=coordination)

    def relay(
        self, decision: Decision, body: JsonObject, *, fallback: bool = True
    ) -> tuple[RelayAnswer | None, Unreached | None]:
        return self.relayer.relay([decision], [body], fallback=fallback)[0]

    # -- decisions no agent answered: parked, retried, or ended at their expiry --------------------

    # -- many decisions at once: lanes (bridge.approver.dispatch) ---------------------------------------

    def drain_lane(self, lane: str, slots: list[Slot]) -> None:
        """Take one lane's batch through :meth:`live` and commit what ended. A decision id another
        worker holds (a replay, the standby's copy) waits until that one is final."""
        if self.stop_event.is_set():
            return  # not finished: not committed, read again after the restart
        mine: list[Slot] = []
        later: list[tuple[Slot, str]] = []
        claimed: list[str] = []
        try:
            for slot in slots:
                decision_id = peek(slot.fields, "decisionId")
                if decision_id is not None and not self.claims.claim(decision_id):
                    later.append((slot, decision_id))  # another worker has this id: after it is final
                    continue
                if decision_id is not None:
                    claimed.append(decision_id)
                mine.append(slot)
            for slot, result in zip(mine, self.live(mine), strict=True):
                if result is not None:
                    self.commits.finished(slot)
        finally:
            for decision_id in claimed:
                self.claims.release(decision_id)
        for slot, decision_id in later:
            if self.claims.wait_released(decision_id, self.stop_event):
                self._settle(slot)

    def _synced(self, slots: list[Slot], alone: bool) -> bool:
        """Sync the decision store for a batch. When the disk refuses (EIO, ENOSPC), a batch of one
        raises (:meth:`handle` waits for the disk); a larger batch goes message by message that way
        instead: it must not be left neither finished nor retried, holding every later commit back."""
        try:
            self.store.sync()
            return True
        except OSError as exc:
            if alone:
                raise
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
                        return False  # parked (or stopping): relayed again later, committed once final
                else:
                    self._give_up(slot)
                self.audit.streak.success()
                break
            except (OutboxFull, OutboxWriteError) as exc:  # not the message's fault: wait for room
                self.audit.streak.failure(
                    "outbox", f"audit record not admitted: {exc}", position=str(message.position)
                )
            except Exception as exc:
                if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
                    # The decision store cannot be written (disk full, I/O error): not the message's
                    # fault either. Counted as a poison attempt, valid decisions were given up.
                    self.audit.streak.failure(
                        "store",
                        f"decision store not writable: {exc.strerror}",
                        position=str(message.position),
                    )
                    if self.stop_event.wait(backoff.next_delay()):
                        return False
                    continue
                errors += 1
                log.exception(
                    "decision could not be processed",
                    extra={"position": str(message.position), "attempt": errors},
                )
            if self.stop_event.wait(backoff.next_delay()):
                return False
        return True

    def _give_up(self, slot: Slot) -> None:
        decision_id = peek(slot.fields, "decisionId")
        started = decision_id is not None and self.store.get(decision_id) is not None
        # Once started it may have reached an agent: say "failed", not "refused" (the agent's own
        # audit record tells whether a StartRequest was posted).
        ending = Ending(
            "failed" if started else "refused",
            "unprocessable",
            f"processing failed {POISON_ATTEMPTS} times; see the approver log",
        )
        self.audit.finish(slot.fields, slot.message, ending, record_final=started)


class ParkedDecisions:
    """Decisions no agent answered: kept uncommitted, relayed again after a backoff (0.5 s doubling
    to ``PARKED_MAX_DELAY``) until an agent answers, and ended at their expiry with their one final
    outcome. A standby's copy its owner finished meanwhile is dropped, never audited."""

    def __init__(self, life: DecisionLife) -> None:
        self.life = life
        self.parking = Parking(self.resubmit, self.expire)
        self._parked_log = RateLimitedLog(log, every=10.0, level=logging.WARNING)

    def may_fall_back(self, chunk: list[Prepared]) -> bool:
        """Whether the ARM fallback may be taken in this round: after ``ARM_AFTER`` rounds without an
        agent, none of which can have reached one (else the agent may have posted already); at once
        for VMs no agent watches, as Azure's signed reconciliation says (no agent to wait for)."""
        if any(p.slot.standby for p in chunk):
            rounds = ARM_AFTER + STANDBY_ARM_EXTRA  # the owner's turn first (STANDBY_ARM_EXTRA)
            return all(
                not p.slot.maybe_sent
                and p.slot.unreached + 1 >= rounds
                and not self.life.owner_finished(p.slot.message)
                for p in chunk
            )
        if all(self.life.router.nobody_watches(p.decision) for p in chunk):
            return True
        return all(not p.slot.maybe_sent and p.slot.unreached + 1 >= ARM_AFTER for p in chunk)

    def park(self, slot: Slot, decision: Decision, unreached: Unreached) -> None:
        """No agent answered: keep the decision, uncommitted, and relay it again after a backoff
        (0.5 s doubling to ``PARKED_MAX_DELAY``), until an agent answers or the decision expires."""
        slot.decision = decision
        slot.unreached += 1
        slot.maybe_sent = slot.maybe_sent or not unreached.never_sent
        slot.unreached_since = slot.unreached_since or time.time()
        delay = min(PARKED_MAX_DELAY, 0.5 * 2 ** (slot.unreached - 1)) * random.uniform(0.8, 1.0)
        self.parking.park(slot, delay, decision.expires)
        self.life.metrics.parked.set(self.parking.count)
        self._parked_log.log(
            "decision waits for an agent of its event (not committed; retried until it expires)",
            decisionId=decision.decision_id,
            target=decision.target,
            attempts=slot.unreached,
            retryInSeconds=round(delay, 2),
            error=unreached.why,
        )

    def resubmit(self, slot: Slot) -> bool:
        self.life.metrics.parked.set(self.parking.count)
        if self.owner_took_it(slot):
            return True
        return self.life.lanes.add(lane_of(slot.fields), slot, self.life.stop_event)

    def owner_took_it(self, slot: Slot) -> bool:
        """The standby's copy of a decision its owner has finished meanwhile: dropped, unaudited (the
        owner's audit is the decision's one final outcome)."""
        if not (slot.standby and self.life.owner_finished(slot.message)):
            return False
        log.info(
            "standby: the owner finished the decision; its copy is dropped",
            extra={"position": str(slot.message.position)},
        )
        self.life.commits.finished(slot)
        return True

    def expire(self, slot: Slot) -> None:
        """A parked decision expired before any agent answered: its one final outcome. ``failed``
        when provably no request reached an agent (nothing was posted), ``unknown`` when one may
        have (connected, no answer: the agent's ledger and audit tell)."""
        if self.owner_took_it(slot):
            self.life.metrics.parked.set(self.parking.count)
            return
        outcome = "unknown" if slot.maybe_sent else "failed"
        since = slot.unreached_since or time.time()
        detail = (
            f"no agent of the event answered in {slot.unreached} attempts over {time.time() - since:.0f} s "
            f"before the decision expired{'; one may have reached an agent' if slot.maybe_sent else ''}"
        )
        ending = Ending(outcome, "expired", detail)
        finish = lambda: self.life.audit.finish(slot.decision, slot.message, ending)  # noqa: E731
        if self.life.audit.until_stored(finish, slot.message) is not None:
            self.life.commits.finished(slot)
        self.life.metrics.parked.set(self.parking.count)


#: One line a minute for decisions of another VM (local mode), with the count.
_SKIPPED_LOG = RateLimitedLog(log, every=60.0)


def _skipped(decision: Decision, router: LocalRouter | FleetRouter, metrics: ApproverMetrics) -> Result:
    """Another VM's approver acts on it (local mode): no audit here, but never unseen, since a
    target no VM has is skipped by every approver (one line a minute, with the count)."""
    metrics.skipped.labels("otherVm").inc()
    _SKIPPED_LOG.log(
        "decision for another VM skipped (its own approver acts on it)",
        decisionId=decision.decision_id,
        target=decision.target,
        thisVm=sorted(router.this_vm() or ()) if isinstance(router, LocalRouter) else None,
    )
    return {"outcome": "skipped", "reason": "otherVm"}


def validated(slot: Slot, policy: ValidationPolicy, now: float) -> Decision:
    """The decision in the slot's message once every check passed; :class:`DecisionRefused`
    otherwise. Nothing here raises anything else: a message that cannot be read is a refusal,
    never a retry (a poison message must not wedge the source)."""
    payload = slot.message.payload
    if len(payload) > MAX_MESSAGE_BYTES:
        raise DecisionRefused("tooLarge", f"message of {len(payload)} bytes (at most {MAX_MESSAGE_BYTES})")
    if slot.fields is None:
        raise DecisionRefused("schema", "message is not a JSON object")
    try:
        strict = loads_strict(payload)  # I-JSON: no member twice (bridge.decisions)
    except ValueError as exc:
        raise DecisionRefused("schema", f"not I-JSON: {exc}") from None
    try:
        return validate(strict, policy, now)
    except DecisionRefused:
        raise
    except Exception as exc:  # a check that could not run proves nothing: refuse
        raise DecisionRefused("schema", f"cannot be validated: {type(exc).__name__}: {exc}") from None


def _chunks(prepared: list[Prepared]) -> list[list[Prepared]]:
    """Relay requests of at most ``LANE_BATCH`` decisions and ``MAX_RELAY_BYTES``."""
    out: list[list[Prepared]] = [[]]
    size = 0
    for item in prepared:
        item_size = len(orjson.dumps(item.body))
        if out[-1] and (len(out[-1]) >= LANE_BATCH or size + item_size > MAX_RELAY_BYTES):
            out.append([])
            size = 0
        out[-1].append(item)
        size += item_size
    return out
