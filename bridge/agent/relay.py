"""The relay: the only path from an approval to IMDS (``POST /v1/start-requests`` on the agent).

The agent is the only process that talks to IMDS, so approvals come to it: from the VM-local
approver, from a fleet approver over the network (authenticated), or from the agent's own local
policies and hooks. The relay is three parts, each a module:

* **intake** (here): a request is parsed (:mod:`bridge.relay_api`), each decision from outside the
  agent proven by the agent itself (:mod:`bridge.agent.proof`), queued, and batched: requests that
  arrive while a StartRequests POST is under way are handled together next. Each decision is checked
  against the agent's *current* document (polled afresh once when a request names an event it does
  not show: the agents of one availability set poll at different moments, and a decision may come
  from another VM's record) by the rule every approving path applies (:mod:`bridge.eligibility`):
  the event must exist (``notFound``), be ``Scheduled`` (``alreadyStarted``, ``notScheduled``), and
  name this VM unless configured otherwise (``notThisVm``);
* **posting** (:mod:`bridge.agent.posting`): the approvable events of a batch in one StartRequests
  POST, noted durably first, each decision answered once and kept (a repeat gets the same answer and
  no second POST), a POST interrupted by a restart resolved after it;
* **answers** (:mod:`bridge.agent.answers`): each answer counted and audited.

Its dependencies come to the constructor: the current document (a :class:`DocumentView`: the
poller), this VM's identity, the poster and the answers; nothing is wired in afterwards.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from bridge.agent.answers import DecisionMeta, RelayAnswers
from bridge.agent.posting import Checked, StartRequestPoster
from bridge.agent.proof import DecisionProver, Unproven
from bridge.eligibility import EventFacts, check_event
from bridge.imds.client import ImdsClient
from bridge.imds.document import EventsDocument, ScheduledEvent
from bridge.imds.instance import VmIdentity
from bridge.relay_api import EventResult, RelayAnswer, RelayDecision, RelayRequestError, parse_request
from bridge.schemas import JsonObject
from bridge.support.observability import ErrorStreak

log = logging.getLogger(__name__)

#: Longest wait for a fresh document when a decision names an event the agent has not seen yet:
#: one IMDS poll normally takes milliseconds; an approver's relay timeout is seconds.
REFRESH_TIMEOUT = 2.0
NO_DOCUMENT = "no Scheduled Events document observed yet; try again"

#: What :meth:`Relay.handle` answers: an HTTP status and its JSON body.
Reply = tuple[int, JsonObject]


class DocumentView(Protocol):
    """The agent's current document, and a way to ask for a fresh one (the poller)."""

    def document(self) -> EventsDocument | None: ...

    def refresh(self, timeout: float) -> bool: ...


@dataclass(slots=True)
class _Pending:
    """One decision of a request, waiting for (or answered by) a batch."""

    decision_id: str
    event_ids: list[str]
    meta: DecisionMeta
    requester: str = ""
    component: str = "agent"
    done: bool = False
    repeat: bool = False
    error: str | None = None  # answered 503 with it: no document yet
    answer: RelayAnswer | None = None
    posted: int = 0
    unproven: bool = False  # refused by the agent's own proof: answered, counted, never audited

    def finish(self, answer: RelayAnswer | None = None, error: str | None = None) -> None:
        self.answer, self.error, self.done = answer, error, True


class Relay:
    def __init__(
        self,
        client: ImdsClient,
        documents: DocumentView,
        identity: Callable[[], VmIdentity],
        poster: StartRequestPoster,
        answers: RelayAnswers,
        *,
        require_this_vm: bool = True,
        prover: DecisionProver | None = None,
    ) -> None:
        self._client = client
        self._documents = documents
        self._identity = identity
        self._poster = poster
        self._answers = answers
        # Proves each decision a caller relays (bridge.agent.proof); None: nothing from outside the
        # agent is acted on (its own policy and coordinator approve in-process, for this VM only).
        self._prover = prover
        self._queue_lock = threading.Lock()
        self._queue: list[_Pending] = []  # requests waiting for the next batch
        self._malformed = ErrorStreak(log, "refusing malformed relay requests")
        self.require_this_vm = require_this_vm

    def handle(self, body: object, requester: str, component: str = "agent") -> Reply:
        """Process one request body (already JSON-decoded). Returns (HTTP status, answer).

        A body is one decision (``decisionId``, ``eventIds``, ...) or, from an approver with several
        decisions for this VM in hand, ``{"decisions": [...]}`` in their order (answered with
        ``{"answers": [...]}``, one per decision, each as for a single one).

        Requests that arrive while a StartRequests POST is under way wait for it and are then handled
        together by one of them (the others only wait): their events go to IMDS in one POST (the API
        takes a list), each decision still gets its own checks, answer, ledger entry and audit record.
        """
        try:
            parsed, many = parse_request(body)
        except RelayRequestError as err:
            # Counted and logged once per streak, never audited: an audit record is for a decision,
            # and a flood of malformed requests must not flood the records stream.
            self._answers.count("refused", "malformed")
            self._malformed.failure("malformed", str(err), requester=requester)
            return 400, {"error": str(err)}
        self._malformed.success()
        pendings = [self._pending(d, requester, component) for d in parsed]
        with self._queue_lock:
            self._queue.extend(p for p in pendings if not p.done)
        with self._poster.lock:  # one batch at a time: the ledger checks and the POST go together
            if not all(p.done for p in pendings):
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._process(batch)
        replies = [self._respond(p) for p in pendings]
        if not many:
            return replies[0]
        status = 503 if any(code == 503 for code, _ in replies) else 200
        return status, {"answers": [answer for _, answer in replies]}

    def _pending(self, decision: RelayDecision, requester: str, component: str) -> _Pending:
        """One decision of a request, proven first when it comes from outside the agent: an
        unproven one is answered at once (refused ``unproven``) and never reaches the ledger."""
        if component == "agent":
            proven = (
                self._prover.prove(decision)
                if self._prover is not None
                else Unproven("not proven by this agent: it holds no decision key (decision_key)")
            )
            if isinstance(proven, Unproven):
                pending = _Pending(
                    decision.decision_id, list(decision.event_ids), DecisionMeta(), requester, component
                )
                results = tuple(EventResult(e, "unproven", proven.detail) for e in decision.event_ids)
                pending.unproven = True
                pending.finish(RelayAnswer(decision.decision_id, "refused", "unproven", results))
                return pending
            decision = proven
        return _Pending(decision.decision_id, list(decision.event_ids), _meta(decision), requester, component)

    def _respond(self, pending: _Pending) -> Reply:
        """Count and audit one answered decision; its (status, answer)."""
        answer = pending.answer
        if pending.error is not None or answer is None:
            return 503, {"error": pending.error or NO_DOCUMENT}
        if pending.unproven:
            self._answers.count("refused", "unproven")
            return 200, answer.to_json()
        if pending.repeat:
            # Same decision again (an approver retried after a crash): same answer, no second POST.
            self._answers.audit(
                pending.component, pending.requester, answer, pending.event_ids, pending.meta,
                detail="repeat of an earlier request: answered from the ledger, nothing posted",
                start_requests_posted=0,
            )  # fmt: skip
            return 200, {**answer.to_json(), "repeat": True}
        self._answers.count(answer.outcome, answer.reason)
        self._answers.audit(
            pending.component, pending.requester, answer, pending.event_ids, pending.meta,
            start_requests_posted=pending.posted,
        )  # fmt: skip
        return 200, answer.to_json()

    def _process(self, batch: list[_Pending]) -> None:
        """Answer every request of ``batch``: repeats from the ledger, the others checked against the
        current document and their approvable events posted together (the poster's lock held)."""
        doc = self._documents.document()
        if doc is not None and self._poster.interrupted():
            self._poster.resolve(doc)  # before any decision of that POST can be taken for a new one
        fresh: dict[str, _Pending] = {}
        for p in batch:
            if self._poster.answered(p.decision_id) is not None or p.decision_id in fresh:
                p.repeat = True  # answered below, once the first of its id has its answer
            elif doc is None:
                p.finish(error=NO_DOCUMENT)
            else:
                fresh[p.decision_id] = p
        if fresh and doc is not None:
            doc = self._refreshed(doc, fresh.values())
            events = doc.by_id()
            self._poster.forget_gone(events)
            checked = {d: self._check(events, p) for d, p in fresh.items()}
            reserved = any(c.approvable for c in checked.values())
            if reserved:
                # Wait for the IMDS slot this POST will use *before* closing the batch: what arrives
                # meanwhile rides the same POST, so a decision waits one slot, never two (issue 19).
                self._client.wait_for_slot()
                self._gather_late(events, fresh, checked, batch)
            answers = self._poster.post(doc, list(checked.values()), reserved)
            for decision_id, p in fresh.items():
                p.posted = 1 if checked[decision_id].approvable else 0
                p.finish(answers[decision_id])
        for p in batch:
            if p.repeat:
                earlier = self._poster.answered(p.decision_id)
                if earlier is None:  # its first copy got no answer (no document yet): neither does it
                    p.repeat = False
                    p.finish(error=NO_DOCUMENT)
                else:
                    p.finish(earlier)

    def _gather_late(
        self,
        events: dict[str, ScheduledEvent],
        fresh: dict[str, _Pending],
        checked: dict[str, Checked],
        batch: list[_Pending],
    ) -> None:
        """Take the requests that arrived while this batch waited for its IMDS slot into it: a
        repeat is answered from the ledger with the rest; one naming an event this document does
        not show goes back to the queue (the next batch refreshes the document for it)."""
        with self._queue_lock:
            late, self._queue = self._queue, []
        back = []
        for p in late:
            if self._poster.answered(p.decision_id) is not None or p.decision_id in fresh:
                p.repeat = True
            elif any(e not in events for e in p.event_ids):
                back.append(p)
                continue
            else:
                fresh[p.decision_id] = p
                checked[p.decision_id] = self._check(events, p)
            batch.append(p)
        if back:
            with self._queue_lock:
                self._queue[:0] = back

    def _refreshed(self, doc: EventsDocument, requests: Iterable[_Pending]) -> EventsDocument:
        """The document to check ``requests`` against: a fresh one when one names an event the
        current document does not show (this VM's agent may not have polled since it appeared;
        see :meth:`bridge.agent.poller.Poller.refresh`). One refresh per batch, at most."""
        known = doc.by_id()
        unknown = [e for p in requests for e in p.event_ids if e not in known]
        if not unknown:
            return doc
        started = time.monotonic()
        refreshed = self._documents.refresh(REFRESH_TIMEOUT)
        log.info(
            "relay refreshed the document for events it did not show",
            extra={"eventIds": unknown[:10], "refreshed": refreshed,
                   "ms": round((time.monotonic() - started) * 1000, 1)},
        )  # fmt: skip
        return self._documents.document() or doc

    def _check(self, events: dict[str, ScheduledEvent], pending: _Pending) -> Checked:
        """Which events of a decision can be posted, and the results of those that cannot, by the
        rule every approving path applies (:func:`bridge.eligibility.check_event`)."""
        vm = self._identity()
        names = {*vm.names(), (vm.vm_id or "").lower()} - {""}
        checked = Checked(
            pending.decision_id, pending.event_ids, pending.meta, pending.requester, pending.component
        )
        now = time.time()
        for event_id in pending.event_ids:
            event = events.get(event_id)
            facts = None if event is None else EventFacts(event.event_status, event.resources)
            refusal = check_event(
                facts,
                approver_names=names,
                target=pending.meta.target,
                expires_at=pending.meta.expires_at,
                now=now,
                require_this_vm=self.require_this_vm,
            )
            posted = self._poster.posted_already(event_id)
            if refusal is not None:
                checked.results[event_id] = EventResult(event_id, refusal.result, refusal.detail)
            elif posted is not None:
                detail = f"StartRequest already posted (post {posted}); not posted again"
                checked.results[event_id] = EventResult(event_id, "approved", detail)
            else:
                checked.approvable.append(event_id)
        return checked


def _meta(decision: RelayDecision) -> DecisionMeta:
    """What the relay keeps of a request's decision beside its ids (checked, answered, audited)."""
    return DecisionMeta(
        target=decision.target,
        issued_by=decision.issued_by,
        expires_at=decision.expires_epoch(),
        coordination=decision.coordination,
    )
