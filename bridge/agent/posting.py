"""Posting StartRequests exactly once: the part of the relay that must never approve twice.

Every decision the relay checked ends here: its approvable events are noted durably *before* the POST
(:meth:`bridge.agent.ledger.DecisionLedger.intend`), posted in one StartRequests per batch (the API
takes a list; a burst of approvals costs a few IMDS requests and stays inside IMDS's budget), and the
answers stored with one write. A POST a previous run sent without seeing IMDS's answer is resolved
against the first document of this run (``Started`` or gone: approved; still ``Scheduled``:
``unknown``, and the decision is not kept, so an approver's retry posts again, a no-op for IMDS if
the first POST arrived). One batch at a time (:attr:`lock`): the ledger checks and the POST go
together, so at most one POST is ever under way.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass, field

from bridge.agent.answers import DecisionMeta, RelayAnswers
from bridge.agent.ledger import DecisionLedger, IntendedDecision, PostIntent
from bridge.imds.client import ImdsClient, ImdsError
from bridge.imds.document import SCHEDULED, EventsDocument, ScheduledEvent
from bridge.relay_api import EventResult, RelayAnswer, RelayAnswerError, outcome_of
from bridge.schemas import JsonObject

log = logging.getLogger(__name__)

#: Events in one StartRequests POST. IMDS documents no limit on the list; 100 keeps the body near
#: 5 KB, and a burst of a few hundred approvals within a few IMDS requests.
MAX_EVENTS_PER_POST = 100


@dataclass(slots=True)
class Checked:
    """One decision of a batch, checked: the results of its events that cannot be posted, and the
    ids of those that can, in request order."""

    decision_id: str
    event_ids: list[str]
    meta: DecisionMeta
    requester: str
    component: str
    results: dict[str, EventResult] = field(default_factory=dict)
    approvable: list[str] = field(default_factory=list)


class StartRequestPoster:
    def __init__(self, client: ImdsClient, ledger: DecisionLedger, answers: RelayAnswers) -> None:
        self._client = client
        self._ledger = ledger
        self._answers = answers
        #: One batch at a time: the ledger checks and the POST go together (taken by the relay's
        #: intake around a whole batch, and here around a resolution).
        self.lock = threading.Lock()
        # Events a POST already approved while the document still shows them Scheduled (IMDS takes a
        # moment to start them): a later decision for one is answered without a second StartRequest.
        self._requested: dict[str, str] = {}  # event id -> post id

    # -- the ledger, read -------------------------------------------------------------------------

    def answered(self, decision_id: str) -> RelayAnswer | None:
        """The answer the ledger keeps for a decision (a repeat gets it again, nothing posted)."""
        kept = self._ledger.get(decision_id)
        if kept is None:
            return None
        try:
            return RelayAnswer.from_json(kept)
        except RelayAnswerError as exc:  # a ledger of another version: the decision still is not posted twice
            log.error("relay ledger entry unreadable", extra={"decisionId": decision_id, "error": str(exc)})
            return RelayAnswer(decision_id, "unknown", "unreadableLedger")

    def approved(self, event_id: str) -> bool:
        """Whether this VM's relay approved the event (or sent a POST for it IMDS may have taken)."""
        return event_id in self._requested or self._ledger.approved(event_id)

    def posted_already(self, event_id: str) -> str | None:
        """The POST that already carried the event in this run, if any."""
        return self._requested.get(event_id)

    def forget_gone(self, events: dict[str, ScheduledEvent]) -> None:
        """Drop the events the document no longer shows from the POSTs remembered (lock held)."""
        self._requested = {e: post for e, post in self._requested.items() if e in events}

    # -- one batch --------------------------------------------------------------------------------

    def post(self, doc: EventsDocument, batch: list[Checked], reserved: bool) -> dict[str, RelayAnswer]:
        """Post the approvable events of ``batch`` together (``reserved``: the IMDS slot is taken
        already) and answer each decision; the answers are stored with one write (lock held)."""
        candidates = list(dict.fromkeys(e for c in batch for e in c.approvable))
        post_id = str(uuid.uuid4())
        if candidates:
            self._intend(post_id, candidates, batch)
        posted = self._post(candidates, len(batch), post_id, reserved)
        answers: dict[str, RelayAnswer] = {}
        for c in batch:
            for event_id in c.approvable:
                c.results[event_id] = posted[event_id]
            ordered = tuple(c.results[e] for e in c.event_ids)
            outcome, reason = outcome_of(ordered)
            answers[c.decision_id] = RelayAnswer(
                c.decision_id,
                outcome,
                reason,
                ordered,
                document_incarnation=doc.incarnation,
                start_requests=post_id if c.approvable else None,
            )
        self._ledger.put_many({d: a.to_json() for d, a in answers.items()})
        return answers

    def _intend(self, post_id: str, candidates: list[str], batch: list[Checked]) -> None:
        """Note the POST durably before it is sent (bridge.agent.ledger). A disk that refuses the
        note is no reason to refuse the approval: the POST goes out, the risk is logged."""
        decisions = [
            IntendedDecision(
                c.decision_id, c.event_ids, {e: _kept(r) for e, r in c.results.items()},
                c.meta.to_json(), c.requester, c.component,
            )
            for c in batch
            if c.approvable
        ]  # fmt: skip
        try:
            self._ledger.intend(PostIntent(post_id, candidates, decisions))
        except OSError as exc:
            log.error(
                "cannot note the StartRequests POST before sending it; a restart before IMDS answers "
                "will not know it was sent",
                extra={"error": str(exc), "post": post_id},
            )

    def _post(
        self, event_ids: list[str], decisions: int, post_id: str, reserved: bool
    ) -> dict[str, EventResult]:
        """One StartRequests POST per ``MAX_EVENTS_PER_POST`` events: the result of each event."""
        out: dict[str, EventResult] = {}
        for start in range(0, len(event_ids), MAX_EVENTS_PER_POST):
            chunk = event_ids[start : start + MAX_EVENTS_PER_POST]
            extra = {"eventIds": chunk, "decisions": decisions, "post": post_id}
            try:
                self._client.post_start_requests(chunk, reserved=reserved and start == 0)
                out.update({e: EventResult(e, "approved") for e in chunk})
                self._requested.update(dict.fromkeys(chunk, post_id))
                log.info("StartRequests posted", extra=extra)
            except ImdsError as err:
                out.update({e: EventResult(e, "imdsError", str(err)) for e in chunk})
                log.error("StartRequests failed", extra={**extra, "error": str(err)})
        return out

    # -- a POST a previous run left unanswered ----------------------------------------------------

    def interrupted(self) -> bool:
        return self._ledger.interrupted() is not None

    def resolve_interrupted(self, doc: EventsDocument) -> None:
        """Resolve the POST a previous run of the agent sent without seeing IMDS's answer, against
        the first document of this run (the poller calls it; a relay batch may come first, and then
        resolves it itself before any decision of its own)."""
        if self._ledger.interrupted() is None:
            return
        if not self.lock.acquire(blocking=False):
            # A relay batch holds the lock and may be waiting for this very poll (a refresh): the
            # batch resolves it first; this thread only makes sure, once the batch is done.
            threading.Thread(target=self._resolve_locked, args=(doc,), daemon=True).start()
            return
        try:
            self.resolve(doc)
        finally:
            self.lock.release()

    def _resolve_locked(self, doc: EventsDocument) -> None:
        with self.lock:
            self.resolve(doc)

    def resolve(self, doc: EventsDocument) -> None:
        """Each event of the interrupted POST: ``Started`` or gone since means IMDS took it
        (approved); still ``Scheduled`` means nobody can tell (``unknown``). One audit record per
        decision, then the intent is forgotten (lock held)."""
        intent = self._ledger.interrupted()
        if intent is None:
            return
        events = doc.by_id()
        kept: dict[str, RelayAnswer] = {}
        for d in intent.decisions:
            results = {e: _kept_result(e, r) for e, r in d.results.items()}
            for event_id in intent.event_ids:
                if event_id in d.event_ids and event_id not in results:
                    results[event_id] = _after_restart(event_id, events.get(event_id))
            ordered = tuple(results[e] for e in d.event_ids if e in results)
            outcome, reason = outcome_of(ordered)
            answer = RelayAnswer(
                d.decision_id, outcome, reason, ordered,
                document_incarnation=doc.incarnation, start_requests=intent.post_id,
            )  # fmt: skip
            if outcome != "unknown":
                kept[answer.decision_id] = answer
            self._answers.count(outcome, reason)
            self._answers.audit(
                d.component, d.requester, answer, d.event_ids, DecisionMeta.from_json(d.meta),
                detail="StartRequests POST sent before the agent stopped, resolved after its restart",
                start_requests_posted=1,
            )  # fmt: skip
        try:
            if kept:
                self._ledger.put_many({d: a.to_json() for d, a in kept.items()})
            self._ledger.resolved()
        except OSError as exc:  # resolved again at the next start: audited twice, never lost
            log.error("cannot store the resolved POST", extra={"error": str(exc), "post": intent.post_id})
        log.warning(
            "StartRequests POST interrupted by a restart resolved",
            extra={"post": intent.post_id, "decisions": len(intent.decisions), "kept": len(kept)},
        )


def _kept(result: EventResult) -> JsonObject:
    """A result as the intent keeps it (its detail always: null when there is none)."""
    return result.to_json() | {"detail": result.detail}


def _kept_result(event_id: str, result: JsonObject) -> EventResult:
    """A result an intent kept (the events of a decision answered without the POST)."""
    try:
        return EventResult.from_json({**result, "eventId": event_id})
    except RelayAnswerError:
        return EventResult(event_id, "unknown", "kept result unreadable")


def _after_restart(event_id: str, event: ScheduledEvent | None) -> EventResult:
    """What became of an event an interrupted POST named (see :meth:`StartRequestPoster.resolve`)."""
    if event is None:
        return EventResult(event_id, "approved", "posted before a restart; the event is gone since")
    if event.event_status == SCHEDULED:
        detail = "posted before a restart; still Scheduled, so whether IMDS took the POST is unknown"
        return EventResult(event_id, "unknown", detail)
    return EventResult(
        event_id, "approved", f"posted before a restart; the event is {event.event_status} since"
    )
