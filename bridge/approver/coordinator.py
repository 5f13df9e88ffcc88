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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge import coordination
from bridge.coordination import CoordinationPolicy, Verdict
from bridge.imds.document import SCHEDULED
from bridge.records.preparation import Preparation
from bridge.records.reader import Record
from bridge.records.scheduled_events import ScheduledEvents

log = logging.getLogger(__name__)

#: An event never seen again is forgotten this long after its NotBefore (or after it was last seen).
FORGET_AFTER = 3600.0
#: Seconds before an approval that reached no agent of its event is tried again (each try already
#: went through every VM of the event a few times, bridge.approver.relaying).
RETRY_AFTER = 5.0


@dataclass
class _Event:
    resources: list[str]
    not_before: str | None
    seen_at: float
    reports: dict[str, str] = field(default_factory=dict)  # lower-cased VM name -> last report


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
        self._early: dict[str, dict[str, str]] = {}  # reports that came before their event's record
        # Event ids a verdict was acted on, or that left Scheduled (-> when), forgotten after a day.
        self._done: dict[str, float] = {}
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
            for event in record.events:
                event_id = event.event_id
                if event.status != SCHEDULED:
                    self._done[event_id] = now  # Started (or gone): nothing left to approve
                    self._events.pop(event_id, None)
                    self._retry_at.pop(event_id, None)
                    continue
                known = self._events.get(event_id)
                if known is None:
                    known = _Event(list(event.resources), event.not_before, now)
                    known.reports.update(self._early.pop(event_id, {}))
                    self._events[event_id] = known
                known.seen_at = now

    def _observe_preparation(self, record: Preparation) -> None:
        if record.vm is None or not record.vm.name:
            return
        with self._lock:
            known = self._events.get(record.event_id)
            reports = known.reports if known is not None else self._early.setdefault(record.event_id, {})
            reports[record.vm.key] = record.result

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
                if event_id in self._done or self._retry_at.get(event_id, 0.0) > now:
                    continue
                members = coordination.members(event.resources)
                reports: dict[str, str | None] = {
                    m: event.reports.get(m) for m in members if self._runs_agent(m) or m in event.reports
                }
                verdict = coordination.assess(event.resources, reports, event.not_before, now, self.policy)
                if verdict.action != "wait":
                    self._done[event_id] = now
                    due.append((event_id, members, verdict))
                elif now - _last_useful(event) > FORGET_AFTER:
                    self._events.pop(event_id, None)
            for event_id, when in list(self._done.items()):
                if now - when > 24 * FORGET_AFTER:
                    del self._done[event_id]
                    self._retry_at.pop(event_id, None)
        return due


def _last_useful(event: _Event) -> float:
    due = coordination.deadline_at(event.not_before, CoordinationPolicy(deadline=0.0))
    return max(event.seen_at, due or 0.0)
