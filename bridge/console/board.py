"""What the ops console shows, built from the events stream: the fleet's VMs, their open events,
each event's timeline across its VMs, preparations, audits, and the history of closed events.

Everything comes from records the agents and the approvers publish (``scheduledEvents``,
``heartbeat``, ``preparation``, ``approval``); the board keeps no state of its own on disk: a console
that restarts reads the stream again. It is bounded like the fleet approver's view: an event leaves
the open set when no VM shows it any more, its summary goes to the history (at most
``HISTORY_LIMIT`` events, ``history_days`` days), and a VM is flagged *silent* when nothing came from
its agent (a heartbeat included) for ``silent_after`` seconds: a VM whose agent is dead is the one
that will be surprised.

What a person sees must not be steerable by whoever can write the stream (every agent can; issue 31):

* a VM's identity is pinned at first sight (its ``vmId``): a later record naming that VM with another
  vmId changes nothing (counted ``changedClaim``), as the fleet approver does;
* an event's facts (Resources, status, NotBefore, description) are taken only from the VMs the event
  names: a record from a VM the event does not name is ignored for it (``notNamed``), and each
  reporting VM's own Resources are kept, so the approve dialog lists what *the target's own agent*
  reported;
* approvals come only from audit records an approver signed (``--approver-key``, the approvers'
  ``--sign-key``), or from the agent of a VM the event names; preparations only from the preparing
  VM's own records, for an event naming it.

Every change is announced to ``announced.listeners`` as a small typed message (``vm``, ``event``, ``audit``),
which the web layer pushes to the open pages (server-sent events).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bridge.console import fleet_pages
from bridge.imds.document import STATUS_RANK
from bridge.records.approval import Approval
from bridge.records.azure import AzureEvent, Finding
from bridge.records.fields import Envelope, Refused, VmRef
from bridge.records.heartbeat import Heartbeat
from bridge.records.ids import (
    APPROVAL,
    AZURE_EVENT,
    HEARTBEAT,
    PREPARATION,
    RECONCILIATION,
    SCHEDULED_EVENTS,
)
from bridge.records.preparation import Preparation
from bridge.records.reader import Reader, Record
from bridge.records.scheduled_events import ChangeView, EventView, ScheduledEvents
from bridge.signing import KeyRing
from bridge.support.timeutil import epoch_of

#: Timeline entries kept per event (an event has a few per VM: scheduled, started, gone).
MAX_TIMELINE = 400
#: Audit records kept per event.
MAX_AUDITS = 50
#: Closed events kept for the history page.
HISTORY_LIMIT = 50_000
#: This console's own decisions remembered (their verdicts are linked to their events).
MAX_MINE = 10_000
#: VMs the board keeps (issue 33: a hostile stream of 200 000 invented VMs took the console to
#: 684 MB). Past it, the VM heard from least recently that shows no open event is forgotten first,
#: counted as ``se_bridge_console_refused_total{reason="overBudget"}``.
MAX_VMS = 200_000
#: This console's decisions on one event listed on its page (the latest).
MAX_SENT_SHOWN = 10

Message = dict[str, object]


@dataclass(slots=True)
class Sent:
    """A decision this console published (issue 33: the person must see what became of it)."""

    event_id: str  # upper-cased, as the board keys events
    action: str
    at: float
    expires: float
    issued_by: str

    @classmethod
    def now(cls, event_id: str, action: str, expires: float, issued_by: str) -> Sent:
        return cls(event_id.upper(), action, time.time(), expires, issued_by)


#: Why the board did not believe a record or a part of it (the se_bridge_console_refused_total labels).
REFUSALS = ("changedClaim", "notNamed", "unprovenApproval", "overBudget")


@dataclass(slots=True)
class VmRow:
    name: str
    vm_id: str = ""
    resource_group: str = ""
    scale_set: str = ""
    location: str = ""
    zone: str = ""
    last_seen: float = 0.0  # any record of its agent (a heartbeat included)
    heartbeat: float = 0.0  # the interval its agent announced, 0 before its first heartbeat
    events: tuple[str, ...] = ()  # open events its latest record shows
    unwatched: tuple[str, ...] = ()  # open events Azure announced for it and no agent reported

    def take(self, vm: VmRef, at: float, heartbeat: float) -> None:
        """What a record of this VM's (pinned) agent says of it."""
        self.vm_id = self.vm_id or vm.vm_id
        self.resource_group = vm.resource_group or self.resource_group
        self.scale_set = vm.scale_set or self.scale_set
        self.location = vm.location or self.location
        self.zone = vm.zone or self.zone
        self.last_seen = max(self.last_seen, at)
        self.heartbeat = heartbeat or self.heartbeat

    def ended(self, event_id: str) -> None:
        """Azure says the event ended: no longer flagged unwatched here."""
        if event_id in self.unwatched:
            self.unwatched = tuple(e for e in self.unwatched if e != event_id)
            self.events = tuple(e for e in self.events if e != event_id or e in self.unwatched)

    def to_json(self, now: float, silent_after: float) -> dict[str, object]:
        return {
            "name": self.name,
            "vmId": self.vm_id,
            "resourceGroup": self.resource_group,
            "scaleSet": self.scale_set,
            "location": self.location,
            "zone": self.zone,
            "lastSeen": self.last_seen,
            "silent": self.silent(now, silent_after),
            "events": list(self.events),
            "unwatched": list(self.unwatched),
        }

    def silent(self, now: float, silent_after: float) -> bool:
        return now - self.last_seen > silent_after


@dataclass(slots=True)
class EventRow:
    event_id: str
    event_type: str = ""
    source: str = ""
    status: str = ""
    not_before: str | None = None
    not_before_at: float = 0.0  # NotBefore as Unix time (0: none, Started), the fleet page's order
    description: str = ""
    duration: int | None = None
    resources: tuple[str, ...] = ()
    first_seen: float = 0.0
    scheduled_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str | None = None  # completed | canceled | ... once no VM shows it
    reporters: set[str] = field(default_factory=set)
    timeline: deque[dict[str, object]] = field(default_factory=lambda: deque(maxlen=MAX_TIMELINE))
    preparations: dict[str, dict[str, object]] = field(default_factory=dict)
    audits: deque[dict[str, object]] = field(default_factory=lambda: deque(maxlen=MAX_AUDITS))
    approved_at: float | None = None
    approved_by: str | None = None
    azure_outcome: str | None = None  # Completed | Canceled, as Azure's own channel said
    #: Each reporting VM's own Resources (lower-cased VM -> names): what approving through it releases.
    reports: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def note(self, change: ChangeView, vm: str, incarnation: int, at: float) -> None:
        """One VM's change of this event, on its timeline."""
        self.timeline.append(
            {
                "vm": vm,
                "change": change.change,
                "eventStatus": change.status,
                "at": at,
                "incarnation": incarnation,
            }
        )

    def update(self, item: EventView, at: float, reporter: str | None) -> None:
        """Take what a record says of this event: ``reporter`` the VM whose agent reported it (its own
        Resources kept apart: what approving through it releases), None for Azure's channel (its
        Resources only until an agent reports). A late VM's Scheduled never undoes Started."""
        resources = item.resources
        self.event_type = item.event_type or self.event_type
        self.source = item.source or self.source
        if STATUS_RANK.get(item.status, 0) >= STATUS_RANK.get(self.status, 0):
            self.status = item.status or self.status
        if item.not_before is not None and item.not_before != self.not_before:
            self.not_before = item.not_before
            self.not_before_at = epoch_of(item.not_before) or 0.0
        self.description = item.description or self.description
        self.duration = item.duration
        if reporter is None:
            self.resources = self.resources or resources
        else:
            self.reports[reporter] = resources if resources != self.resources else self.resources
            union = tuple(dict.fromkeys(r for names in self.reports.values() for r in names))
            self.resources = union if union != self.resources else self.resources
        if self.status == "Scheduled" and self.scheduled_at is None:
            self.scheduled_at = at
        if self.status == "Started" and self.started_at is None:
            self.started_at = at

    def names(self) -> set[str]:
        return {r.lower() for r in self.resources}

    def target(self) -> str | None:
        """The VM an approval goes through: the first the event names whose agent reported it."""
        named = [r for r in self.resources if r.lower() in self.reports]
        if named:
            return named[0]
        return self.resources[0] if self.resources else None

    def released(self, target: str) -> tuple[str, ...]:
        """What approving through ``target`` releases, as its own agent reported the event."""
        return self.reports.get(target.lower(), self.resources)

    def summary(self) -> dict[str, object]:
        return {
            "eventId": self.event_id,
            "eventType": self.event_type,
            "eventSource": self.source,
            "eventStatus": self.status,
            "notBefore": self.not_before,
            "resources": list(self.resources),
            "description": self.description,
            "durationInSeconds": self.duration,
            "outcome": self.outcome,
            "azureOutcome": self.azure_outcome,
            "approved": self.approved_at is not None,
            "approvedBy": self.approved_by,
            "preparations": {vm: p["result"] for vm, p in self.preparations.items()},
            "target": (target := self.target()),
            "releases": list(self.released(target)) if target else [],
        }

    def detail(self) -> dict[str, object]:
        return {
            **self.summary(),
            "firstSeen": self.first_seen,
            "scheduledAt": self.scheduled_at,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
            "approvedAt": self.approved_at,
            "timeline": list(self.timeline),
            "preparationRecords": list(self.preparations.values()),
            "audits": list(self.audits),
        }


class Announcements:
    """The board's messages handed to its listeners, and counted. A page asks for its data and opens
    its live stream at once (issue 33: waiting for the stream cost its first frame ~50-80 ms); the
    count its data was read at and the count its stream started from tell it whether a message fell
    between the two (then it loads its data again)."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[Message], None]] = []
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        # Counted before it is handed out: a message a stream got before it opened is within the
        # count the stream starts from, and one counted before an answer was read is in the answer.
        with self._lock:
            self.count += 1
            for listener in self.listeners:
                listener(message)


class Board:
    def __init__(
        self,
        *,
        silent_after: float = 900.0,
        history_days: float = 30.0,
        azure_keys: KeyRing | None = None,
        approver_keys: KeyRing | None = None,
    ) -> None:
        #: Azure's channel is shown only when its records verify (every agent writes to the stream, and a
        #: forged "unwatched" or "Completed" would mislead the person about to approve); empty: not shown.
        #: The approvers' --sign-key: their audit records count only when they verify (issue 31).
        #: Both are checked by the reader, where records come off the stream, once.
        self.reader = Reader(
            azure_keys=azure_keys,
            approver_keys=approver_keys,
            types=(SCHEDULED_EVENTS, HEARTBEAT, PREPARATION, APPROVAL, AZURE_EVENT, RECONCILIATION),
        )
        #: Records (or parts of them) the board refused, by reason: a metric (bounded labels).
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        #: The decisions this console published, by id: their event (the most recent MAX_MINE). An
        #: approver's verdict on a message it could not prove (unknownKey, badSignature) names the
        #: decision only under ``unverified``; this is how the person still sees it (issue 33).
        self._mine: OrderedDict[str, Sent] = OrderedDict()
        self.silent_after = silent_after
        self.history_days = history_days
        self._lock = threading.Lock()
        self._vms: dict[str, VmRow] = {}
        self._events: dict[str, EventRow] = {}
        # Closed events by id, the oldest closure first. Kept as rows, not summaries: a VM whose
        # records come late (its partition behind the others) can still show an event the others
        # already dropped; the row is then reopened, not counted as a second event.
        self._closed = History(history_days)
        self._pages = fleet_pages.FleetPages(silent_after)
        self.announced = Announcements()

    # -- reading the stream -------------------------------------------------------------------------

    def take(self, record: Record | Refused | None, now: float | None = None) -> None:
        """One record of the events stream, as :class:`~bridge.records.reader.Reader` read it (a
        refused record, or one of a type the board does not show, changes nothing)."""
        now = time.time() if now is None else now
        if isinstance(record, ScheduledEvents):
            self._scheduled_events(record, now)
        elif isinstance(record, Heartbeat):
            self._seen(record, now, heartbeat=record.interval)
        elif isinstance(record, Preparation):
            self._preparation(record, now)
        elif isinstance(record, Approval):
            self._approval(record, now)
        elif isinstance(record, AzureEvent) and record.signed_by is not None:
            self._azure_event(record, now)
        elif isinstance(record, Finding) and record.finding == "unwatched" and record.signed_by is not None:
            self._unwatched(record, now)

    def _seen(self, record: Envelope, now: float, heartbeat: float = 0.0) -> VmRow | None:
        vm = record.vm
        if vm is None or not vm.name:
            return None
        key = vm.key
        with self._lock:
            row = self._vms.get(key)
            if row is not None and row.vm_id and vm.vm_id and vm.vm_id != row.vm_id.lower():
                self.refused["changedClaim"] += 1  # another VM speaking in this one's name
                return None
            if row is None:
                row = self._add_vm(key, VmRow(vm.name))
            else:
                self._vms[key] = self._vms.pop(key)  # heard from most recently last (see _add_vm)
            row.take(vm, record.observed_at or now, heartbeat)
        if heartbeat:  # a page judges silence by lastSeen: every heartbeat moves it on
            self.announced({"type": "vm", "vm": row.to_json(now, self.silent_after)})
        return row

    def _add_vm(self, key: str, row: VmRow) -> VmRow:
        """A new VM (under the lock); past MAX_VMS the least recently heard VM with no open event goes."""
        self._vms[key] = row
        if len(self._vms) > MAX_VMS:
            for old_key, old in self._vms.items():
                if not old.events and old_key != key:
                    del self._vms[old_key]
                    self.refused["overBudget"] += 1
                    break
        return row

    def _scheduled_events(self, record: ScheduledEvents, now: float) -> None:
        row = self._seen(record, now)
        if row is None:
            return
        at = record.observed_at or now
        shown: list[str] = []
        changed: list[EventRow] = []
        with self._lock:
            for item in record.events:
                event = self._event_from(item, at, row.name.lower())
                if event is None:
                    continue
                shown.append(event.event_id)
                event.reporters.add(row.name.lower())
                changed.append(event)
            for change in record.changes:
                changed_event = self._events.get(change.event_id.upper())
                if changed_event is not None:
                    changed_event.note(change, row.name, record.incarnation, at)
            for gone in set(row.events) - set(shown) - set(row.unwatched):
                closed = self._unreport(gone, row.name.lower(), record, at)
                if closed is not None:
                    changed.append(closed)
            row.events, row.unwatched = tuple(shown), ()  # its agent speaks for it again
        self.announced({"type": "vm", "vm": row.to_json(now, self.silent_after)})
        for event in changed:
            self.announced({"type": "event", "event": event.summary()})

    def _event_from(self, item: EventView, at: float, reporter: str | None = None) -> EventRow | None:
        """The event ``item`` describes, updated from it. ``reporter``: the (pinned) VM whose agent
        reported it, which must be named by the event (None: Azure's channel, proven already)."""
        event_id, resources = item.event_id.upper(), item.resources
        known = self._events.get(event_id) or self._closed.get(event_id)
        if reporter is not None and (
            reporter not in {r.lower() for r in resources}
            or (known is not None and known.reports and reporter not in known.names())
        ):
            self.refused["notNamed"] += 1  # a VM speaks only for the events that name it
            return None
        event = self._events.get(event_id)
        if event is None:
            event = self._closed.pop(event_id) or EventRow(event_id, first_seen=at)
            event.outcome, event.ended_at = None, None
            self._events[event_id] = event
        event.update(item, at, reporter)
        return event

    def _unreport(self, event_id: str, vm_key: str, record: ScheduledEvents, at: float) -> EventRow | None:
        """A VM's latest record no longer shows the event; once none does, it is closed."""
        event = self._events.get(event_id)
        if event is None:
            return None
        event.reporters.discard(vm_key)
        if event.reporters:
            return None
        del self._events[event_id]
        gone = record.change_of(event_id)
        event.outcome = (gone.change if gone else "") or event.outcome or "gone"
        self._closed.close(event_id, event, at)
        return event

    def _azure_event(self, record: AzureEvent, now: float) -> None:
        """Azure's own channel (bridge.azure), signed by its key (the reader verified it): an event
        no agent reports is shown from it, and how an event ended is Azure's word (an agent only sees
        it vanish). The agents' view of an event they report is not overwritten."""
        item = record.event
        key, status, at = item.event_id.upper(), item.status, record.observed_at or now
        with self._lock:
            event = self._events.get(key)
            if status in ("Completed", "Canceled"):
                if event is not None and not event.reporters:
                    del self._events[key]
                    event.outcome = event.outcome or status.lower()
                    self._closed.close(key, event, at)
                event = event or self._closed.get(key)
                if event is not None:
                    event.azure_outcome = status
                    for row in self._vms.values():
                        row.ended(key)
            elif event is None or not event.reporters:
                event = self._event_from(item, at)
        if event is not None:
            self.announced({"type": "event", "event": event.summary()})

    def _unwatched(self, record: Finding, now: float) -> None:
        """A reconciliation finding: Azure announced the event for this VM and no agent reported it. The
        VM is listed with the event, flagged (its agent is dead, not installed, or cut off)."""
        vm, key = record.vm, record.event_id.upper()
        if vm is None or not vm.name:
            return
        name = vm.name
        with self._lock:
            event = self._events.get(key)
            if event is None or event.reporters & {name.lower()}:
                return  # ended already, or its agent reported it meanwhile
            row = self._vms.get(name.lower())
            if row is None:
                row = self._add_vm(name.lower(), VmRow(name, resource_group=vm.resource_group))
            row.unwatched = tuple(dict.fromkeys((*row.unwatched, key)))
            row.events = tuple(dict.fromkeys((*row.events, key)))
        self.announced({"type": "vm", "vm": row.to_json(now, self.silent_after)})

    def _preparation(self, record: Preparation, now: float) -> None:
        row = self._seen(record, now)
        if row is None:
            return
        with self._lock:
            event = self._events.get(record.event_id.upper())
            if event is None:
                return
            if row.name.lower() not in event.names():
                self.refused["notNamed"] += 1  # a VM reports its own preparation, for its own events
                return
            event.preparations[row.name.lower()] = {
                "vm": row.name, "result": record.result, "at": record.observed_at or now,
                "hook": None if record.hook is None else record.hook.to_json(),
            }  # fmt: skip
        self.announced({"type": "event", "event": event.summary()})

    def published(self, decision_id: str, sent: Sent) -> dict[str, object]:
        """A decision this console signed and published: its verdict is shown whatever it is, and
        until there is one, what it waits for. Returns what the page shows at once."""
        now = sent.at
        with self._lock:
            self._mine[decision_id] = sent
            while len(self._mine) > MAX_MINE:
                self._mine.popitem(last=False)
            event = self._events.get(sent.event_id)
            return _sent_json(decision_id, sent, event, self._vms, now, self.silent_after)

    def _approval(self, record: Approval, now: float) -> None:
        audit = _audit_of(record, now)
        events = [e.upper() for e in record.event_ids]
        mine = record.unverified.get("decisionId")
        if not events and mine is not None and mine in self._mine:  # refused before it was proven
            events, audit["decisionId"] = [self._mine[mine].event_id], mine
        shown = []
        with self._lock:
            for event_id in events:
                event = self._events.get(event_id) or self._closed.get(event_id)  # the audit came late
                if event is None:
                    continue
                if not _approval_proven(record, event, self._vms.get(record.vm.key) if record.vm else None):
                    self.refused["unprovenApproval"] += 1
                    continue
                shown.append(event_id)
                event.audits.append(audit)
                if record.outcome == "approved" and event.approved_at is None:
                    event.approved_at, event.approved_by = record.observed_at or now, record.issued_by or ""
        if shown:
            self.announced({"type": "audit", "audit": audit, "eventIds": shown})

    # -- what the pages ask -------------------------------------------------------------------------

    def fleet(
        self,
        now: float | None = None,
        query: str = "",
        group_by: str = "resourceGroup",
        opened: Sequence[str] = (),
        limit: int = fleet_pages.FIRST_EVENTS,
    ) -> dict[str, object]:
        """The fleet page's first answer (:mod:`~bridge.console.fleet_pages`)."""
        now = time.time() if now is None else now
        with self._lock:
            changes = self.announced.count  # read before the rows: every change counted is in them
            answer = self._pages.first(self._vms, self._events, now, query, group_by, opened, limit)
        answer["changes"] = changes
        return answer

    def fleet_events(
        self, query: str = "", after: str = "", limit: int = fleet_pages.MAX_PAGE
    ) -> dict[str, object]:
        """The open events after the page's cursor ``after`` (NotBefore order), at most ``limit``."""
        with self._lock:
            return self._pages.after(self._events, query, after, limit)

    def event(self, event_id: str, now: float | None = None) -> dict[str, object] | None:
        key = event_id.upper()
        now = time.time() if now is None else now
        with self._lock:
            event = self._events.get(key)
            if event is not None:
                sent = [
                    _sent_json(d, s, event, self._vms, now, self.silent_after)
                    for d, s in self._mine.items()
                    if s.event_id == key
                ]
                return {**event.detail(), "open": True, "sent": sent[-MAX_SENT_SHOWN:]}
            closed = self._closed.get(key)
            return None if closed is None else {**closed.detail(), **_closure(closed), "open": False}

    def scheduled(self, event_id: str) -> EventRow | None:
        """The open event if it waits for approval (the console approves nothing else)."""
        with self._lock:
            event = self._events.get(event_id.upper())
            return event if event is not None and event.status == "Scheduled" else None

    def history(
        self, days: float | None = None, group: str = "", now: float | None = None
    ) -> dict[str, object]:
        """Closed events per day and type, notice given and approval lead time, for the last days
        (``group``: a resource group's or a scale set's VMs only)."""
        now = time.time() if now is None else now
        with self._lock:
            return self._closed.summary(days or self.history_days, _members(self._vms, group), now)

    def counts(self) -> tuple[int, int, int]:
        """(VMs, silent VMs, open events): the console's gauges."""
        now = time.time()
        with self._lock:
            silent = sum(1 for v in self._vms.values() if v.silent(now, self.silent_after))
            return len(self._vms), silent, len(self._events)


def _members(vms: dict[str, VmRow], group: str) -> set[str] | None:
    """The VMs of a resource group or scale set (lower-cased names); None: no group, every VM."""
    return (
        {v.name.lower() for v in vms.values() if group in (v.resource_group, v.scale_set)} if group else None
    )


def _sent_json(
    decision_id: str,
    sent: Sent,
    event: EventRow | None,
    vms: dict[str, VmRow],
    now: float,
    silent_after: float,
) -> dict[str, object]:
    """One of this console's decisions as the event page shows it (under the board's lock): answered
    or not, and when not, whether any agent of the event is reporting at all (no agent: the approvers
    can only retry until the decision expires, or acknowledge through ARM if they run with it)."""
    # The approvers' verdict (an agent's own audit of the relay is not one: the page shows theirs).
    answered = event is not None and any(
        a.get("decisionId") == decision_id and a.get("component") != "agent" for a in event.audits
    )
    silent: list[str] = []
    if event is not None:
        for name in event.resources:
            row = vms.get(name.lower())  # VM rows are keyed by name, case-folded
            if row is None or row.silent(now, silent_after):
                silent.append(name)
    reporting = event is not None and len(silent) < len(event.resources)
    return {
        "decisionId": decision_id,
        "action": sent.action,
        "at": sent.at,
        "expires": sent.expires,
        "issuedBy": sent.issued_by,
        "answered": answered,
        "agentsSilent": silent,
        "anyAgentReporting": reporting,
    }


def _approval_proven(record: Approval, event: EventRow, row: VmRow | None) -> bool:
    """An approver's audit counts when an approver signed it (the reader verified the signature with
    the approvers' keys); an agent's (its relay, its local policy, its coordinator) when that VM's
    pinned agent (``row``) wrote it and the event names the VM."""
    if record.component == "approver":
        return record.signed_by is not None
    vm = record.vm
    if vm is None or vm.key not in event.names():
        return False
    return row is not None and (not row.vm_id or not vm.vm_id or row.vm_id.lower() == vm.vm_id)


def _audit_of(record: Approval, now: float) -> dict[str, object]:
    """An approval record as an event's page lists it."""
    return {
        "decisionId": record.decision_id,
        "component": record.component,
        "outcome": record.outcome,
        "reason": record.reason or "",
        "decisionReason": record.decision_reason or "",
        "detail": record.detail or "",
        "issuedBy": record.issued_by or "",
        "path": record.path or "",
        "requester": record.requester or "",
        "coordination": record.coordination,
        "at": record.observed_at or now,
        "vm": None if record.vm is None else record.vm.name,
    }


class History:
    """Closed events by id, the oldest closure first, kept to ``days`` days and HISTORY_LIMIT events
    (issue 33: each closed event kept ~8.7 KB, mostly its timeline, for up to 50 000 events, and
    ``--history-days`` only filtered the page: 406-483 MB after 20 waves at 10 000 VMs). Kept as
    rows, not summaries: a VM whose records come late (its partition behind the others) can still
    show an event the others already dropped; the row is then reopened, not counted twice. The
    board's lock guards it."""

    def __init__(self, days: float) -> None:
        self.days = days
        self._rows: OrderedDict[str, EventRow] = OrderedDict()

    def get(self, event_id: str) -> EventRow | None:
        return self._rows.get(event_id)

    def pop(self, event_id: str) -> EventRow | None:
        return self._rows.pop(event_id, None)

    def close(self, event_id: str, event: EventRow, at: float) -> None:
        """Into the history, compacted; the oldest beyond the bounds forgotten."""
        event.ended_at = at
        _compact(event)
        self._rows[event_id] = event
        self._rows.move_to_end(event_id)
        horizon = at - self.days * 86400
        while self._rows and (
            len(self._rows) > HISTORY_LIMIT or (next(iter(self._rows.values())).ended_at or at) < horizon
        ):
            self._rows.popitem(last=False)

    def summary(self, days: float, names: set[str] | None, now: float) -> dict[str, object]:
        """The history page's figures (``names``: only events naming one of these VMs)."""
        since = now - days * 86400
        rows = [e for e in self._rows.values() if (e.ended_at or 0) >= since]
        if names is not None:
            rows = [e for e in rows if names.intersection(r.lower() for r in e.resources)]
        per_day: dict[str, dict[str, int]] = {}
        for e in rows:
            day, kind = time.strftime("%Y-%m-%d", time.gmtime(e.ended_at or now)), e.event_type or "?"
            per_day.setdefault(day, {})
            per_day[day][kind] = per_day[day].get(kind, 0) + 1
        notice = [n for e in rows if (n := _notice(e)) is not None]
        lead = [n for e in rows if (n := _lead(e)) is not None]
        shown = HISTORY_FIELDS
        return {
            "days": sorted(per_day.items()),
            "events": [{k: c[k] for k in shown} for c in map(_closure, rows[-500:])],
            "noticeSeconds": _spread(notice),
            "approvalLeadSeconds": _spread(lead),
        }


#: What the history page shows of each closed event.
HISTORY_FIELDS = (
    "eventId",
    "eventType",
    "outcome",
    "endedAt",
    "noticeSeconds",
    "approvalLeadSeconds",
    "approvedBy",
)


def _notice(event: EventRow) -> float | None:
    """Seconds between the event's Scheduled and its Started, as the agents saw them."""
    if event.started_at is None or event.scheduled_at is None:
        return None
    return round(event.started_at - event.scheduled_at, 1)


def _lead(event: EventRow) -> float | None:
    """Seconds its approval came before NotBefore."""
    not_before = epoch_of(event.not_before)
    if event.approved_at is None or not_before is None:
        return None
    return round(not_before - event.approved_at, 1)


def _closure(event: EventRow) -> dict[str, object]:
    return {
        "eventId": event.event_id,
        "eventType": event.event_type,
        "outcome": event.outcome,
        "endedAt": event.ended_at,
        "approvedBy": event.approved_by,
        "resources": event.resources,
        "noticeSeconds": _notice(event),
        "approvalLeadSeconds": _lead(event),
    }


#: What a closed event keeps: the history needs its summary; its page the last of its timeline.
CLOSED_TIMELINE = 24
CLOSED_AUDITS = 5


def _compact(event: EventRow) -> None:
    """A closed event's detail cut to what its history row and page still show."""
    if len(event.timeline) > CLOSED_TIMELINE:
        event.timeline = deque(list(event.timeline)[-CLOSED_TIMELINE:], maxlen=MAX_TIMELINE)
    if len(event.audits) > CLOSED_AUDITS:
        event.audits = deque(list(event.audits)[-CLOSED_AUDITS:], maxlen=MAX_AUDITS)
    for vm, prep in event.preparations.items():
        event.preparations[vm] = {"vm": prep.get("vm"), "result": prep.get("result"), "at": prep.get("at")}
    event.reports = {}  # who reported what: only an open event's approval needs it
    event.reporters = set()


def _spread(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "max": None}
    ordered = sorted(values)
    return {"n": len(ordered), "p50": ordered[len(ordered) // 2], "max": ordered[-1]}
