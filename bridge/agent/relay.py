"""The relay: the only path from an approval to IMDS (``POST /v1/start-requests`` on the agent).

The agent is the only process that talks to IMDS, so approvals come to it: from the VM-local
approver, from a fleet approver over the network (authenticated), or from the agent's own local
policies and hooks. For every request the relay:

1. checks each event against the agent's *current* document (polled afresh once when a request
   names an event it does not show: the agents of one availability set poll at different moments,
   and a decision may come from another VM's record): it must exist (``notFound``), be
   ``Scheduled`` (a ``Started`` one is answered ``alreadyStarted``, not an error; any other status
   ``notScheduled``), and name this VM in ``Resources`` unless configured otherwise (``notThisVm``);
2. posts one ``StartRequests`` for the events that passed, through the agent's IMDS client (so it
   shares the one connection and the request budget with the poller, StartRequests first), retrying
   transient answers. Requests arriving while a POST is under way are handled together next, their
   events in one POST (the API takes a list): a burst of approvals costs a few IMDS requests, not
   one each, and stays inside IMDS's budget;
3. answers per event (``approved``, ``alreadyStarted``, ``notFound``, ``notScheduled``,
   ``notThisVm``, ``imdsError``) and publishes the attempt as an audit record
   (``recordType: approval``) through the normal outbox and sinks.

Exactly one POST per decision: the relay remembers each ``decisionId`` it handled (persisted in the
state directory) and answers a repeat with the stored result without posting again. An approver that
crashed between relaying and committing its offset therefore cannot approve twice.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge import records
from bridge.agent.ledger import DecisionLedger, PostIntent
from bridge.agent.proof import DecisionProver, Unproven
from bridge.eligibility import EventFacts, check_event
from bridge.imds.client import ImdsClient, ImdsError
from bridge.imds.document import SCHEDULED
from bridge.imds.instance import VmIdentity
from bridge.observability import ErrorStreak
from bridge.pipeline import Outbox, RecordMeta
from bridge.pipeline.storing import REFUSED
from bridge.relay_api import RelayDecision, RelayRequestError, parse_request

log = logging.getLogger(__name__)

#: Events in one StartRequests POST. IMDS documents no limit on the list; 100 keeps the body near
#: 5 KB, and a burst of a few hundred approvals within a few IMDS requests.
MAX_EVENTS_PER_POST = 100
#: Longest wait for a fresh document when a decision names an event the agent has not seen yet:
#: one IMDS poll normally takes milliseconds; an approver's relay timeout is seconds.
REFRESH_TIMEOUT = 2.0


@dataclass
class _Pending:
    """One relay request waiting for (or answered by) a batch."""

    decision_id: str
    event_ids: list[str]
    meta: dict[str, Any]
    requester: str = ""
    component: str = "agent"
    done: bool = False
    repeat: bool = False
    status: int = 0
    answer: dict[str, Any] = field(default_factory=dict)
    posted: int = 0
    unproven: bool = False  # refused by the agent's own proof: answered, counted, never audited

    def finish(self, status: int, answer: dict[str, Any]) -> None:
        self.status, self.answer, self.done = status, answer, True


class Relay:
    def __init__(
        self,
        client: ImdsClient,
        current_document: Any,
        identity: Any,
        outbox: Outbox,
        metrics: Any,
        state_dir: Path,
        *,
        require_this_vm: bool = True,
        api_version: str,
        refresh: Callable[[float], bool] | None = None,
        prover: DecisionProver | None = None,
    ) -> None:
        self._client = client
        # Proves each decision a caller relays (bridge.agent.proof); None: nothing from outside the
        # agent is acted on (its own policy and coordinator approve in-process, for this VM only).
        self._prover = prover
        self._current = current_document  # callable -> EventsDocument | None
        self._refresh = refresh  # poll IMDS now and wait (seconds) -> whether it finished
        self._identity = identity  # callable -> VmIdentity
        self._outbox = outbox
        self._metrics = metrics
        self._ledger = DecisionLedger(state_dir)
        self._lock = threading.Lock()  # one batch at a time: the ledger checks and the POST go together
        self._queue_lock = threading.Lock()
        self._queue: list[_Pending] = []  # requests waiting for the next batch
        # Events a POST already approved while the document still shows them Scheduled (IMDS takes a
        # moment to start them): a later decision for one is answered without a second StartRequest.
        self._requested: dict[str, str] = {}  # event id -> post id
        self._malformed = ErrorStreak(log, "refusing malformed relay requests")
        self.require_this_vm = require_this_vm
        self.api_version = api_version

    def handle(
        self,
        body: Any,
        requester: str,
        component: str = "agent",
    ) -> tuple[int, dict[str, Any]]:
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
            self._count("refused", "malformed")
            self._malformed.failure("malformed", str(err), requester=requester)
            return 400, {"error": str(err)}
        self._malformed.success()
        pendings = [self._pending(d, requester, component) for d in parsed]
        with self._queue_lock:
            self._queue.extend(p for p in pendings if not p.done)
        with self._lock:  # one batch at a time: the ledger checks and the POST go together
            if not all(p.done for p in pendings):
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._process(batch)
        answers = [self._respond(p) for p in pendings]
        if not many:
            return answers[0]
        status = 503 if any(code == 503 for code, _ in answers) else 200
        return status, {"answers": [answer for _, answer in answers]}

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
                pending = _Pending(decision.decision_id, list(decision.event_ids), {}, requester, component)
                results = [_result(e, "unproven", proven.detail) for e in decision.event_ids]
                answer = {"decisionId": decision.decision_id, "outcome": "refused", "reason": "unproven",
                          "results": results}  # fmt: skip
                pending.unproven = True
                pending.finish(200, answer)
                return pending
            decision = proven
        return _Pending(decision.decision_id, list(decision.event_ids), _meta(decision), requester, component)

    def _respond(self, pending: _Pending) -> tuple[int, dict[str, Any]]:
        """Count and audit one answered decision; its (status, answer)."""
        request = {**pending.meta, "eventIds": pending.event_ids}
        requester, component = pending.requester, pending.component
        if pending.unproven:
            self._count("refused", "unproven")
            return 200, pending.answer
        if pending.repeat:
            # Same decision again (an approver retried after a crash): same answer, no second POST.
            detail = "repeat of an earlier request: answered from the ledger, nothing posted"
            self._audit(component, requester, pending.answer, request, detail=detail, start_requests_posted=0)
            return 200, {**pending.answer, "repeat": True}
        if pending.status != 200:
            return pending.status, pending.answer
        answer = pending.answer
        self._count(answer["outcome"], answer["reason"] or "ok")
        self._audit(component, requester, answer, request, start_requests_posted=pending.posted)
        return 200, answer

    def _process(self, batch: list[_Pending]) -> None:
        """Answer every request of ``batch``: repeats from the ledger, the others checked against the
        current document and their approvable events posted together."""
        doc = self._current()
        if doc is not None and self._ledger.interrupted() is not None:
            self._resolve(doc)  # before any decision of that POST can be taken for a new one
        fresh: dict[str, _Pending] = {}
        for p in batch:
            earlier = self._ledger.get(p.decision_id)
            if earlier is not None or p.decision_id in fresh:
                p.repeat = True  # answered below, once the first of its id has its answer
            elif doc is None:
                p.finish(503, {"error": "no Scheduled Events document observed yet; try again"})
            else:
                fresh[p.decision_id] = p
        if fresh:
            assert doc is not None
            doc = self._refreshed(doc, fresh.values())
            events = doc.by_id()
            self._requested = {e: post for e, post in self._requested.items() if e in events}
            checked = {d: self._check(events, p.event_ids, p.meta) for d, p in fresh.items()}
            reserved = any(approvable for _, approvable in checked.values())
            if reserved:
                # Wait for the IMDS slot this POST will use *before* closing the batch: what arrives
                # meanwhile rides the same POST, so a decision waits one slot, never two (issue 19).
                self._client.wait_for_slot()
                self._gather_late(events, fresh, checked, batch)
            self._approve_together(doc, list(fresh.values()), [checked[d] for d in fresh], reserved)
            self._ledger.put_many({p.decision_id: p.answer for p in fresh.values()})
        for p in batch:
            if p.repeat:
                earlier = self._ledger.get(p.decision_id)
                if earlier is None:  # its first copy got no answer (no document yet): neither does it
                    p.repeat = False
                    p.finish(503, {"error": "no Scheduled Events document observed yet; try again"})
                else:
                    p.finish(200, earlier)

    def _gather_late(
        self,
        events: dict[str, Any],
        fresh: dict[str, _Pending],
        checked: dict[str, tuple[dict[str, dict[str, Any]], list[str]]],
        batch: list[_Pending],
    ) -> None:
        """Take the requests that arrived while this batch waited for its IMDS slot into it: a
        repeat is answered from the ledger with the rest; one naming an event this document does
        not show goes back to the queue (the next batch refreshes the document for it)."""
        with self._queue_lock:
            late, self._queue = self._queue, []
        back = []
        for p in late:
            if self._ledger.get(p.decision_id) is not None or p.decision_id in fresh:
                p.repeat = True
            elif any(e not in events for e in p.event_ids):
                back.append(p)
                continue
            else:
                fresh[p.decision_id] = p
                checked[p.decision_id] = self._check(events, p.event_ids, p.meta)
            batch.append(p)
        if back:
            with self._queue_lock:
                self._queue[:0] = back

    def _refreshed(self, doc: Any, requests: Any) -> Any:
        """The document to check ``requests`` against: a fresh one when one names an event the
        current document does not show (this VM's agent may not have polled since it appeared;
        see :meth:`bridge.agent.poller.Poller.refresh`). One refresh per batch, at most."""
        known = doc.by_id()
        unknown = [e for p in requests for e in p.event_ids if e not in known]
        if not unknown or self._refresh is None:
            return doc
        started = time.monotonic()
        refreshed = self._refresh(REFRESH_TIMEOUT)
        log.info(
            "relay refreshed the document for events it did not show",
            extra={"eventIds": unknown[:10], "refreshed": refreshed,
                   "ms": round((time.monotonic() - started) * 1000, 1)},
        )  # fmt: skip
        return self._current() or doc

    def _approve_together(
        self,
        doc: Any,
        requests: list[_Pending],
        checked: list[tuple[dict[str, dict[str, Any]], list[str]]],
        reserved: bool,
    ) -> None:
        """Post the approvable events of ``requests`` together (``reserved``: the IMDS slot is
        taken already) and answer each request."""
        candidates = list(dict.fromkeys(e for _, approvable in checked for e in approvable))
        post_id = str(uuid.uuid4())
        if candidates:
            self._intend(post_id, candidates, requests, checked)
        posted = self._post(candidates, len(requests), post_id, reserved)
        for p, (results, approvable) in zip(requests, checked, strict=True):
            for event_id in approvable:
                results[event_id] = posted[event_id]
            ordered = [results[e] for e in p.event_ids]
            outcome, reason = _outcome(ordered)
            p.posted = 1 if approvable else 0
            p.finish(
                200,
                {
                    "decisionId": p.decision_id,
                    "outcome": outcome,
                    "reason": reason,
                    "results": ordered,
                    "documentIncarnation": doc.incarnation,
                    # Which POST carried this decision (the ledger keeps it): one id for a batch.
                    **({"startRequests": post_id} if approvable else {}),
                },
            )

    def _check(
        self, events: dict[str, Any], event_ids: list[str], meta: dict[str, Any]
    ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """The results of the events that cannot be approved, and the ids of those that can
        (``events``: the current document's, by id), by the rule every approving path applies
        (:func:`bridge.eligibility.check_event`)."""
        vm: VmIdentity = self._identity()
        names = {*vm.names(), (vm.vm_id or "").lower()} - {""}
        results: dict[str, dict[str, Any]] = {}
        candidates: list[str] = []
        now = time.time()
        for event_id in event_ids:
            event = events.get(event_id)
            facts = None if event is None else EventFacts(event.event_status, event.resources)
            refusal = check_event(
                facts,
                approver_names=names,
                target=meta.get("target"),
                expires_at=meta.get("expiresAt"),
                now=now,
                require_this_vm=self.require_this_vm,
            )
            if refusal is not None:
                results[event_id] = _result(event_id, refusal.result, refusal.detail)
            elif event_id in self._requested:
                detail = f"StartRequest already posted (post {self._requested[event_id]}); not posted again"
                results[event_id] = _result(event_id, "approved", detail)
            else:
                candidates.append(event_id)
        return results, candidates

    def _intend(
        self,
        post_id: str,
        candidates: list[str],
        requests: list[_Pending],
        checked: list[tuple[dict[str, dict[str, Any]], list[str]]],
    ) -> None:
        """Note the POST durably before it is sent (bridge.agent.ledger). A disk that refuses the
        note is no reason to refuse the approval: the POST goes out, the risk is logged."""
        decisions = [
            {"decisionId": p.decision_id, "eventIds": p.event_ids, "results": results, "meta": p.meta,
             "requester": p.requester, "component": p.component}
            for p, (results, approvable) in zip(requests, checked, strict=True)
            if approvable
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
        self, event_ids: list[str], decisions: int, post_id: str, reserved: bool = False
    ) -> dict[str, dict[str, Any]]:
        """One StartRequests POST per ``MAX_EVENTS_PER_POST`` events: the result of each event
        (``post_id`` names this batch's POSTs in the ledger and the log)."""
        out: dict[str, dict[str, Any]] = {}
        for start in range(0, len(event_ids), MAX_EVENTS_PER_POST):
            chunk = event_ids[start : start + MAX_EVENTS_PER_POST]
            extra = {"eventIds": chunk, "decisions": decisions, "post": post_id}
            try:
                self._client.post_start_requests(chunk, reserved=reserved and start == 0)
                out.update({e: _result(e, "approved", None) for e in chunk})
                self._requested.update(dict.fromkeys(chunk, post_id))
                log.info("StartRequests posted", extra=extra)
            except ImdsError as err:
                out.update({e: _result(e, "imdsError", str(err)) for e in chunk})
                log.error("StartRequests failed", extra={**extra, "error": str(err)})
        return out

    # -- what this VM approved, across restarts (bridge.agent.ledger) -----------------------------

    def approved(self, event_id: str) -> bool:
        """Whether this VM's relay approved the event (or sent a POST for it IMDS may have taken)."""
        return event_id in self._requested or self._ledger.approved(event_id)

    def resolve_interrupted(self, doc: Any) -> None:
        """Resolve the POST a previous run of the agent sent without seeing IMDS's answer, against
        the first document of this run (the poller calls it; a relay request may come first)."""
        if self._ledger.interrupted() is None:
            return
        if not self._lock.acquire(blocking=False):
            # A relay batch holds the lock and may be waiting for this very poll (a refresh): resolve
            # once it is done, off the poll loop.
            threading.Thread(target=self._resolve_locked, args=(doc,), daemon=True).start()
            return
        try:
            if self._ledger.interrupted() is not None:
                self._resolve(doc)
        finally:
            self._lock.release()

    def _resolve_locked(self, doc: Any) -> None:
        with self._lock:
            if self._ledger.interrupted() is not None:
                self._resolve(self._current() or doc)

    def _resolve(self, doc: Any) -> None:
        """Each event of the interrupted POST: ``Started`` or gone since means IMDS took it
        (approved); still ``Scheduled`` means nobody can tell (``unknown``: the decision is not kept
        in the ledger, so the approver's retry posts it again, which IMDS takes as a no-op if the first
        POST did arrive). One audit record per decision, then the intent is forgotten."""
        intent = self._ledger.interrupted()
        assert intent is not None
        events = doc.by_id()
        answers: dict[str, dict[str, Any]] = {}
        for d in intent.decisions:
            results = {**d.get("results", {})}
            for event_id in intent.event_ids:
                if event_id in d["eventIds"] and event_id not in results:
                    results[event_id] = _after_restart(event_id, events.get(event_id))
            ordered = [results[e] for e in d["eventIds"] if e in results]
            outcome, reason = _outcome(ordered)
            answer = {"decisionId": d["decisionId"], "outcome": outcome, "reason": reason, "results": ordered,
                      "documentIncarnation": doc.incarnation, "startRequests": intent.post_id}  # fmt: skip
            if outcome != "unknown":
                answers[d["decisionId"]] = answer
            request = {**d.get("meta", {}), "eventIds": d["eventIds"]}
            detail = "StartRequests POST sent before the agent stopped, resolved after its restart"
            self._count(outcome, reason or "ok")
            self._audit(d.get("component", "agent"), d.get("requester", ""), answer, request,
                        detail=detail, start_requests_posted=1)  # fmt: skip
        try:
            if answers:
                self._ledger.put_many(answers)
            self._ledger.resolved()
        except OSError as exc:  # resolved again at the next start: audited twice, never lost
            log.error("cannot store the resolved POST", extra={"error": str(exc), "post": intent.post_id})
        log.warning(
            "StartRequests POST interrupted by a restart resolved",
            extra={"post": intent.post_id, "decisions": len(intent.decisions), "kept": len(answers)},
        )

    def _count(self, outcome: str, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.relay_requests.labels(outcome, reason).inc()

    def _audit(
        self, component: str, requester: str, answer: dict[str, Any], meta: dict[str, Any], **more: Any
    ) -> None:
        """Publish the attempt as an approval record (``more``: ``detail``, ``start_requests_posted``)."""
        record = records.approval_record(
            component,
            vm=self._identity(),
            api_version=self.api_version,
            decision_id=answer["decisionId"],
            event_ids=meta["eventIds"],
            target=meta.get("target"),
            issued_by=meta.get("issuedBy"),
            requester=requester,
            outcome=answer["outcome"],
            reason=answer.get("reason"),
            results=answer["results"],
            coordination=meta.get("coordination"),
            **more,
        )
        try:
            self._outbox.append(RecordMeta.of(record), records.encode(record))
        except REFUSED as exc:  # best effort (bridge.pipeline.storing)
            # The approval itself already happened (or was refused); the audit is best effort here
            # and the log line is its trace.
            log.error("audit record not admitted to the outbox", extra={"error": str(exc), "audit": record})


def _meta(decision: RelayDecision) -> dict[str, Any]:
    """What the relay keeps of a request's decision beside its ids (checked, answered, audited)."""
    meta: dict[str, Any] = {
        k: v for k, v in (("target", decision.target), ("issuedBy", decision.issued_by)) if v is not None
    }
    if decision.expires_at is not None:
        meta["expiresAt"] = decision.expires_epoch()
    if decision.coordination is not None:
        meta["coordination"] = decision.coordination
    return meta


def _result(event_id: str, result: str, detail: str | None) -> dict[str, Any]:
    return {"eventId": event_id, "result": result, "detail": detail}


def _after_restart(event_id: str, event: Any) -> dict[str, Any]:
    """What became of an event an interrupted POST named (see :meth:`Relay._resolve`)."""
    if event is None:
        return _result(event_id, "approved", "posted before a restart; the event is gone since")
    if event.event_status == SCHEDULED:
        detail = "posted before a restart; still Scheduled, so whether IMDS took the POST is unknown"
        return _result(event_id, "unknown", detail)
    return _result(event_id, "approved", f"posted before a restart; the event is {event.event_status} since")


def _outcome(results: list[dict[str, Any]]) -> tuple[str, str | None]:
    good = {"approved", "alreadyStarted"}
    kinds = [r["result"] for r in results]
    if "unknown" in kinds:
        return "unknown", "interruptedPost"
    if all(k in good for k in kinds):
        return "approved", None
    failed = [k for k in kinds if k not in good]
    if any(k in good for k in kinds):
        return "partial", failed[0]
    if all(k == "imdsError" for k in failed):
        return "failed", "imdsError"
    return "refused", failed[0]
