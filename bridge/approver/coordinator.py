"""The fleet coordinator: a fleet approver run with ``--coordinate`` approves each event once every
VM it names that runs the agent reported prepared (the rule: :mod:`bridge.coordination`).

What it knows comes from the events stream the fleet approver reads anyway (``--events-source``):

* ``scheduledEvents`` records: the events, their ``Resources`` and ``NotBefore``, and which VMs run
  the agent (any VM that published a record);
* ``preparation`` records: ``prepared`` / ``prepareFailed`` per VM and event (agents run with
  ``coordinate = "fleet"``: they report and never approve themselves).

**One coordinator among the instances**: the instance that reads partition 0 of the decisions source
(Kafka group or Event Hubs ownership); a source without partitions (a file) has one reader anyway.
When that instance dies, partition 0 moves to a survivor with the rest of its share, and the survivor
coordinates. A verdict is acted on through the approver's own path (:meth:`Approver.coordinated`):
the event's one coordinated ``decisionId`` in the decision store, relayed to an agent of the event
with failover (and ARM, if configured), one audit record with the ``coordination`` account. A new
coordinator that acts again on an event its predecessor already approved asks for the same decision
id, on the same VM first: that agent's ledger answers without a second StartRequest. An approval
that reached no agent at all is not spent: it is neither recorded as final nor audited, and the event
is assessed again ``RETRY_AFTER`` seconds later while it is still Scheduled.

**Bounded memory over a month** (issue 33: 1.15 KB kept per event for good, 77.6 -> 121.3 MB over 20
waves at 10 000 VMs; a preparation arriving after its event started, or forged by any agent
credential, kept for good): an event is forgotten ``FORGET_AFTER`` seconds after it was last useful
(its NotBefore, or its last record) whether or not a verdict was given (an ended event simply
vanishes from the agents' documents: no record says so); a preparation for an event already decided
or started is not kept; reports waiting for their event's record are kept ``FORGET_AFTER`` seconds
at most, for at most ``MAX_EARLY_EVENTS`` events; a report counts only for a VM the event names
(or, before its record, for at most ``MAX_RESOURCES`` VMs); the decided events remembered are capped
at ``MAX_DONE``. Every cap drops the oldest first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge import coordination
from bridge.coordination import CoordinationPolicy, Verdict
from bridge.imds.document import SCHEDULED
from bridge.records.fields import MAX_RESOURCES
from bridge.records.preparation import Preparation
from bridge.records.reader import Record
from bridge.records.scheduled_events import ScheduledEvents

log = logging.getLogger(__name__)

#: An event never seen again is forgotten this long after its NotBefore (or after it was last seen).
FORGET_AFTER = 3600.0
#: Seconds before an approval that reached no agent of its event is tried again (each try already
#: went through every VM of the event a few times, bridge.approver.relaying).
RETRY_AFTER = 5.0
#: Changes after which an event has nothing left to approve (it started, or left the document).
ENDED = frozenset({"started", "startedWithoutNotice", "completed", "canceled", "removed"})
#: Events whose preparations came before any record of the event (a partition read ahead): at most.
MAX_EARLY_EVENTS = 10_000
#: Events a verdict was acted on (or that left Scheduled), remembered for a day: at most.
MAX_DONE = 200_000


@dataclass(slots=True)
class _Event:
    resources: list[str]
    not_before: str | None
    seen_at: float
    members: frozenset[str] = frozenset()  # lower-cased VM names the event names
    reports: dict[str, str] = field(default_factory=dict)  # lower-cased VM name -> last report


@dataclass(slots=True)
class _Early:
    """Reports that came before their event's record."""

    first_at: float
    reports: dict[str, str] = field(default_factory=dict)


class FleetCoordinator:
    def __init__(
        self,
        policy: CoordinationPolicy,
        *,
        runs_agent: Callable[[str], bool],
        leader: Callable[[], bool],
        act: Callable[[str, list[str], Verdict], bool],
        interval: float = 1.0,
        retry_after: float = RETRY_AFTER,
    ) -> None:
        self.policy = policy
        self._runs_agent = runs_agent  # lower-cased VM name -> whether the fleet knows its agent
        self._leader = leader  # whether this instance coordinates now
        # (event id, members, verdict) -> done: approve or audit "left to the platform"; False when no
        # agent of the event could be reached, and the event is assessed again after retry_after.
        self._act = act
        self.interval = interval
        self.retry_after = retry_after
        self._lock = threading.Lock()
        self._events: dict[str, _Event] = {}
        self._early: OrderedDict[str, _Early] = OrderedDict()  # oldest first
        # Event ids a verdict was acted on, or that left Scheduled (-> when), forgotten after a day.
        self._done: OrderedDict[str, float] = OrderedDict()
        # Event id -> when an approval that reached no agent of the event is tried again.
        self._retry_at: dict[str, float] = {}

    def observe(self, record: Record) -> None:
        """Take what a record of the events stream says (called by the fleet router's reader)."""
        if isinstance(record, ScheduledEvents):
            self._observe_document(record)
        elif isinstance(record, Preparation):
            self._observe_preparation(record)

    def _observe_document(self, record: ScheduledEvents) -> None:
        now = time.time()
        with self._lock:
            for change in record.changes:
                if change.change in ENDED:  # gone from the document: nothing left to approve
                    self._mark_done(change.event_id, now)
                    self._events.pop(change.event_id, None)
                    self._retry_at.pop(change.event_id, None)
                    self._early.pop(change.event_id, None)
            for event in record.events:
                event_id = event.event_id
                if event.status != SCHEDULED:
                    self._mark_done(event_id, now)  # Started (or gone): nothing left to approve
                    self._events.pop(event_id, None)
                    self._retry_at.pop(event_id, None)
                    self._early.pop(event_id, None)
                    continue
                known = self._events.get(event_id)
                if known is None:
                    resources = list(event.resources)
                    members = frozenset(coordination.members(resources))
                    known = _Event(resources, event.not_before, now, members)
                    early = self._early.pop(event_id, None)
                    if early is not None:
                        known.reports.update((k, v) for k, v in early.reports.items() if k in members)
                    self._events[event_id] = known
                known.seen_at = now

    def _observe_preparation(self, record: Preparation) -> None:
        if record.vm is None or not record.vm.name:
            return
        key = record.vm.key
        with self._lock:
            known = self._events.get(record.event_id)
            if known is not None:
                if key in known.members:  # a VM the event does not name has nothing to report
                    known.reports[key] = record.result
                return
            if record.event_id in self._done:
                return  # decided or started already: too late to matter
            early = self._early.get(record.event_id)
            if early is None:
                early = self._early[record.event_id] = _Early(time.time())
                while len(self._early) > MAX_EARLY_EVENTS:
                    self._early.popitem(last=False)
            if key in early.reports or len(early.reports) < MAX_RESOURCES:
                early.reports[key] = record.result

    def _mark_done(self, event_id: str, now: float) -> None:
        self._done.pop(event_id, None)
        self._done[event_id] = now  # newest last
        while len(self._done) > MAX_DONE:
            gone, _ = self._done.popitem(last=False)
            self._retry_at.pop(gone, None)

    def __len__(self) -> int:
        """Events held (waiting, decided, or reported before their record): what the bounds bound."""
        with self._lock:
            return len(self._events) + len(self._early)

    def run(self, stop: threading.Event) -> None:
        """Assess every waiting event each ``interval`` (on its own thread) until ``stop``."""
        while not stop.wait(self.interval):
            try:
                self.tick(time.time())
            except Exception:  # a bug in one round must not end coordination
                log.exception("coordination round failed")

    def tick(self, now: float) -> None:
        if not self._leader():
            return
        for event_id, members, verdict in self._due(now):
            log.info(
                "coordination verdict",
                extra={
                    "eventId": event_id,
                    "action": verdict.action,
                    "why": verdict.why,
                    "pending": list(verdict.pending),
                },
            )
            if not self._act(event_id, members, verdict):
                # No agent of the event answered (a network partition, every VM of the set
                # restarting): the verdict is not spent. Assessed again later, while the event is
                # still Scheduled (a Started or gone event ends it), so the deadline rule still holds.
                with self._lock:
                    if self._done.get(event_id) == now:  # not if a Started record came meanwhile
                        del self._done[event_id]
                    self._retry_at[event_id] = now + self.retry_after

    def _due(self, now: float) -> list[tuple[str, list[str], Verdict]]:
        due = []
        with self._lock:
            for event_id, event in list(self._events.items()):
                if now - _last_useful(event) > FORGET_AFTER:
                    # Decided or not: an ended event vanishes from the documents, no record says so.
                    del self._events[event_id]
                    continue
                if event_id in self._done or self._retry_at.get(event_id, 0.0) > now:
                    continue
                members = coordination.members(event.resources)
                reports: dict[str, str | None] = {
                    m: event.reports.get(m) for m in members if self._runs_agent(m) or m in event.reports
                }
                verdict = coordination.assess(event.resources, reports, event.not_before, now, self.policy)
                if verdict.action != "wait":
                    self._mark_done(event_id, now)
                    due.append((event_id, members, verdict))
            while self._early and now - next(iter(self._early.values())).first_at > FORGET_AFTER:
                self._early.popitem(last=False)
            while self._done and now - next(iter(self._done.values())) > 24 * FORGET_AFTER:
                gone, _ = self._done.popitem(last=False)
                self._retry_at.pop(gone, None)
        return due


def _last_useful(event: _Event) -> float:
    due = coordination.deadline_at(event.not_before, CoordinationPolicy(deadline=0.0))
    return max(event.seen_at, due or 0.0)
