"""An approver's audit records: each decision's one final outcome, durable before its commit.

Every decision ends as exactly one audit record (``recordType: approval``): appended to the
approver's own outbox (from which its sinks deliver it), then the outcome in the decision store, and
only then, in the caller, the source position committed. A crash anywhere in between re-reads the
message and ends with the same record (its ``recordId`` is deterministic). A full or failing disk is
waited out (:meth:`AuditWriter.until_stored`): a decision is never committed without its record.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar, get_args

from bridge import records
from bridge.approver.dispatch import Slot
from bridge.approver.metrics import ApproverMetrics
from bridge.approver.store import DecisionStore
from bridge.decisions import Decision
from bridge.pipeline import Outbox, OutboxWriteError, RecordMeta
from bridge.pipeline.storing import until_stored
from bridge.relay_api import EventResult, Outcome, RelayAnswer, fits
from bridge.schemas import JsonObject
from bridge.signing import sign_record
from bridge.streams import Message
from bridge.support.observability import ErrorStreak
from bridge.support.retry import Backoff

log = logging.getLogger("bridge.approver.service")  # one logger name for the approver's decisions
T = TypeVar("T")

#: The outcomes an approver's audit record may carry (approval.v1 schema); anything else is "failed".
AUDIT_OUTCOMES = frozenset(get_args(Outcome))


@dataclass(frozen=True, slots=True)
class Ending:
    """How a decision ended, as its audit record tells it: the outcome and why, each event's result,
    and the path that acted (``relay``: the agent's URL, or ``arm``)."""

    outcome: str
    reason: str | None = None
    detail: str | None = None
    results: tuple[EventResult, ...] = ()
    relay: str | None = None
    path: str | None = None
    arm_correlation_id: str | None = None

    @classmethod
    def of_answer(cls, answer: RelayAnswer) -> Ending:
        """An agent's relay answer (or the ARM path's, typed alike: bridge.approver.relaying)."""
        return cls(
            answer.outcome,
            answer.reason,
            answer.detail,
            answer.results,
            relay=answer.relay,
            path=answer.path,
            arm_correlation_id=answer.arm_correlation_id,
        )


class AuditWriter:
    """Writes audit records and final outcomes, and waits for the disk when it refuses them."""

    def __init__(
        self,
        outbox: Outbox,
        store: DecisionStore,
        metrics: ApproverMetrics,
        stop_event: threading.Event,
        signer: tuple[str, bytes] | None = None,
    ) -> None:
        # Signs each audit record (--sign-key): the console shows approvals only from proven approvers.
        self.signer = signer
        self.outbox = outbox
        self.store = store
        self.metrics = metrics
        self.stop_event = stop_event
        self.streak = ErrorStreak(log, "storing decisions and audit records")

    def finish(
        self,
        decision: Decision | Mapping[str, object] | None,
        message: Message,
        ending: Ending,
        *,
        record_final: bool = True,
        sync: bool = True,
        coordination: JsonObject | None = None,
        unverified: dict[str, str] | None = None,
    ) -> JsonObject:
        """Append the decision's audit record (and, ``record_final``, its final outcome in the
        store). ``decision``: a :class:`Decision` proven valid, or the raw object of one refused
        after its signature was proven (its bounded fields are its own), or None."""
        claims: Mapping[str, object] = (
            decision.claims() if isinstance(decision, Decision) else (decision or {})
        )
        audit = _audit_record(claims, message, ending, record_final, coordination, unverified)
        if self.signer is not None:
            audit = sign_record(*self.signer, audit)
        # Durable first, then the store, then (in the caller) the source commit: a crash anywhere
        # re-reads the message and ends with the same outcome. ``sync=False`` (a lane's chunk): the
        # caller syncs the outbox, then the store, before committing.
        self.outbox.append(RecordMeta.of(audit), records.encode(audit), sync=sync)
        decision_id, outcome, event_ids = audit["decisionId"], str(audit["outcome"]), audit["eventIds"]
        if record_final and isinstance(decision_id, str) and decision_id:
            self.store.final(decision_id, message.position, outcome, ending.reason, sync=sync)
        self.metrics.decisions.labels(outcome, ending.reason or "ok").inc()
        log.log(
            logging.INFO if outcome == "approved" else logging.WARNING,
            f"decision {outcome}",
            extra={
                "decisionId": decision_id,
                "eventId": event_ids[0] if isinstance(event_ids, list) and event_ids else None,
                "reason": ending.reason,
                "detail": audit["detail"],
                "relay": ending.relay,
            },
        )
        return audit

    def until_stored(self, store: Callable[[], T], message: Message) -> T | None:
        """Run ``store`` until the disk takes it (full, quota, failing: waited out with backoff, as
        ``DecisionLife.handle`` does) and return what it returned; None when the approver stops
        first (so ``store`` must not return None itself)."""

        def refused(exc: BaseException) -> None:
            self.streak.failure("outbox", f"not stored yet: {exc}", position=str(message.position))

        result = until_stored(store, self.stop_event, refused, Backoff(base=1.0, cap=30.0))
        if result is not None:
            self.streak.success()
        return result

    def synced(self, done: list[tuple[Slot, JsonObject]]) -> bool:
        """One fsync for a chunk's audit records. When it fails, the frames may be gone from the
        disk for good (Linux reports a failed writeback once and forgets the pages), so syncing again
        proves nothing: each audit record is appended again the durable way (same ``recordId``; a
        sink may see it twice), waiting for the disk as ``DecisionLife.handle`` does. False when
        stopping."""
        try:
            self.outbox.sync()
            return True
        except OutboxWriteError as exc:
            log.error("audit records cannot be synced; writing them again", extra={"error": str(exc)})
        for slot, audit in done:
            append = lambda a=audit: self.outbox.append(RecordMeta.of(a), records.encode(a))  # noqa: E731
            if self.until_stored(append, slot.message) is None:
                return False  # nothing committed: read again after the restart
        return True


#: The decision schema's bound on ``reason``: nothing longer is a decision's own words.
MAX_REASON = 2048


def _reason(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_REASON else None


def claims_of(raw: Mapping[str, object] | None) -> dict[str, str] | None:
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


def _audit_record(
    claims: Mapping[str, object],
    message: Message,
    ending: Ending,
    record_final: bool,
    coordination: JsonObject | None,
    unverified: dict[str, str] | None,
) -> JsonObject:
    """The audit record of a decision whose ``claims`` are these: only what fits the decision
    schema's bounds reaches it (a 5 MB decisionId is refused, not stored or echoed)."""

    def text(key: str) -> str | None:
        value = claims.get(key)
        return value if isinstance(value, str) and fits(key, value) else None

    event_id = text("eventId")
    results = list(ending.results) or ([EventResult(event_id, "refused", ending.reason)] if event_id else [])
    return records.approval_record(
        "approver" if coordination is None else "coordinator",
        decision_id=text("decisionId"),
        event_ids=[event_id] if event_id else [],
        target=text("target"),
        issued_by=text("issuedBy"),
        requester=ending.relay,
        outcome=ending.outcome if ending.outcome in AUDIT_OUTCOMES else "failed",
        reason=ending.reason,
        detail=(ending.detail or None) and str(ending.detail)[:500],
        results=[{"eventId": r.event_id, "result": r.result, "detail": r.detail} for r in results],
        path=ending.path,
        arm_correlation_id=ending.arm_correlation_id,
        coordination=coordination,
        unverified=unverified,
        decision_reason=_reason(claims.get("reason")),
        # One record per decision whichever instance writes it (bridge.approver.standby).
        record_id=records.approver_record_id(
            text("decisionId") if record_final else None, str(message.position), message.payload
        ),
    )
