"""Azure's channel joined with the agents' records, by event and VM: what no agent reported, how each
event ended, and what only an agent saw (docs/azure-channel.md).

Findings, each published once as a ``reconciliation`` record:

* **unwatched**: Azure published an event for a VM and no agent record naming that event came from
  that VM within ``grace`` seconds of it (the agent is down, not installed, or cannot reach the bus).
  This is the VM that will be surprised; :meth:`Reconciler.unwatched` lists the open ones (the
  service's ``GET /v1/unwatched``; the console and the approver's ARM fallback can read it).
* **outcome**: Azure said ``Completed`` or ``Canceled`` (an agent only sees the event vanish), with
  the VMs whose agents reported the event, settled ``grace`` seconds after Azure's word (the agents'
  records of the event may be read after it).
* **agentOnly**: an agent reported an event Azure did not publish within ``grace`` seconds: expected
  while the VM's (or its scale set's, availability set's) policy does not publish to Event Grid and
  Resource Graph (preview, off by default), so the finding says so.

The join key is the VM's subscription, resource group and name (``bridge.azure.events.vm_key``). A VM
counts as watched only from its **proven identity** (issue 31: a record in a dead VM's name, from any
agent credential, hid it): the agent's record must carry the VM's ARM resource id exactly as Azure's
own event names it, and the vmId it claims is pinned at the first record for that VM, so another
identity speaking in its name later is refused (``se_bridge_azure_agent_claims_refused_total``). A
record without a resource id (an identity no IMDS answer filled yet) watches nothing. Heartbeats pin
too, so a VM whose agent ever spoke keeps its own vmId. The pins outlive a restart
(``<state-dir>/agent-pins.jsonl``: the agents' stream is read on from where it stopped, so a restart
must not be the moment another identity can claim a VM); new pins are written once a second, with
one fsync (:meth:`Reconciler.save_pins`, from the service's tick: a kill -9 forgets at most that
second's).

Memory is bounded over a month, not only by its caps. An ended event whose findings are all out is
*settled* and forgotten at once: a late word about it (an agent's record, a late delivery) starts
nothing because the ``ended`` oracle, the event tracker's committed state on disk
(``EventTracker.ended``), says Azure ended it; a restart forgets nothing of that either. (Each
settled key used to be kept in memory for an hour, ~200 B each: a 120 000-delivery backlog held
40 000 of them.) An event that never ends here (an agent's event Azure never published: the
agentOnly case, or an ended event whose last word was lost) is forgotten ``stale`` seconds after
anything last named it: 8 days, Azure's longest notice (7 days, for a degraded host) and a day,
walking the events oldest first and stopping at the first to keep, so a poll costs what it forgets.
At most ``max_events`` events are kept (the least recently named first); at most ``max_vms`` pins.
:meth:`Reconciler.in_grace` counts the events whose findings are still due, which the service keeps
bounded (bridge.azure.service.MAX_IN_GRACE): what an event costs in its grace is what a backlog's
memory is made of, so it is kept small (one string for the event's id and key when they are the
same, a check without a tie-breaker of its own, the due time shared by a batch's checks).
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bridge.azure.events import FINAL, AzureEvent, VmRef
from bridge.azure.records import finding_record
from bridge.azure.tracker import News
from bridge.records.heartbeat import Heartbeat
from bridge.records.reader import Record
from bridge.records.scheduled_events import ScheduledEvents
from bridge.schemas import JsonObject
from bridge.shell.journal import Journal

_NO_AGENTS: dict[str, VmRef] = {}  # what an event no agent reported yet holds (see _Event)
Check = Literal["unwatched", "agentOnly", "outcome"]


@dataclass(slots=True, eq=False)
class _Event:
    """What is known of one event. Slotted, its set of flagged VMs made only when first needed (most
    events never have a finding): a backlog holds thousands in their grace. Compared by identity
    (``eq=False``): the checks' heap compares its tuples, and checks due together are many."""

    event_id: str  # as Azure or the agent wrote it
    key: str  # lower case: the one string the events map and every check of the event share
    azure_state: str | None = None
    azure_vms: dict[str, VmRef] = field(default_factory=dict)
    # key -> the VM as its agent named it; the shared empty map until the first agent (never written)
    agent_vms: dict[str, VmRef] = field(default_factory=lambda: _NO_AGENTS)
    ended_at: float | None = None
    named_at: float = 0.0  # when an input last named the event (the stale rule)
    checks: int = 0  # findings still due (in their grace)
    flagged: set[str] | None = None  # VM keys found unwatched (open)
    # No record of the findings published: each (kind, VM) is checked once per event (a VM is
    # added to its map once, an event ends once), so a check is its finding's only chance.

    def __lt__(self, other: _Event) -> bool:
        """A tie-breaker for checks due at the same time (the heap compares its tuples on): any
        fixed order does; the checks' own counter cost an int per check."""
        return self.key < other.key

    def flag(self, key: str) -> None:
        if self.flagged is None:
            self.flagged = set()
        self.flagged.add(key)

    def unflag(self, key: str) -> None:
        if self.flagged is not None:
            self.flagged.discard(key)


class Reconciler:
    def __init__(
        self,
        grace: float = 120.0,
        *,
        ended: Callable[[str], bool],
        stale: float = 8 * 86400.0,
        max_events: int = 100_000,
        max_vms: int = 200_000,
        pins_path: Path | None = None,
    ) -> None:
        self.grace = grace
        #: Whether Azure ended an event (by key) that is not held here: the tracker's committed state.
        self._ended_elsewhere = ended
        self.max_vms = max_vms
        #: vm key -> the vmId its first record claimed (the oldest pin is forgotten past ``max_vms``).
        self._pins: OrderedDict[str, str] = OrderedDict()
        self._journal = None if pins_path is None else Journal(pins_path)
        self._unsaved: list[tuple[str, str]] = []  # pins made since the last save_pins
        if self._journal is not None:
            self._pins.update(self._journal.load())
            while len(self._pins) > self.max_vms:
                self._pins.popitem(last=False)
        #: agent records refused, by reason (a metric: bounded labels)
        self.refused: dict[str, int] = {"noResourceId": 0, "changedClaim": 0}
        self.stale = stale
        self.max_events = max_events
        self._lock = threading.Lock()
        self._events: OrderedDict[str, _Event] = OrderedDict()  # least recently named first
        self._in_grace = 0  # events with findings still due (Reconciler.in_grace)
        # (due, kind, event, vm key): the event object itself, not its key, so a check of an event
        # forgotten (the cap) and named again meanwhile is not counted against the new one.
        self._checks: list[tuple[float, Check, _Event, str]] = []
        self._last_due = 0.0  # one float object for a batch's checks (they are due together)

    # -- inputs ---------------------------------------------------------------------------------------

    def azure(self, event: AzureEvent, news: News, now: float) -> list[JsonObject]:
        """An observation of Azure's channel; the findings it settles at once (none today: an outcome is
        settled by :meth:`due`, after the grace)."""
        with self._lock:
            if event.key not in self._events and self._ended_elsewhere(event.key):
                return []  # ended, its findings out (settled): a late word changes none of them
            state = self._event(event.event_id, now)
            # An event first seen already ended (Resource Graph's history at the first poll) is only
            # an outcome: nobody could have been warned of it any more.
            watchable = state.azure_state is not None or news.state not in FINAL
            state.azure_state = news.state
            for vm in event.vms():
                key = vm.key  # computed once: the map and the check share it
                if key not in state.azure_vms:
                    state.azure_vms[key] = vm
                    if watchable:
                        self._check(now + self.grace, "unwatched", state, key)
            if news.state not in FINAL or state.ended_at is not None:
                return []
            # Settled after the grace, not at first sight (issue 33): Azure's word may be read before
            # the agents' records of the same event, which said "0 agent(s) reported it".
            state.ended_at = now
            self._check(now + self.grace, "outcome", state, "")
            return []

    def agent(self, record: Record, now: float) -> None:
        """An agent's ``scheduledEvents`` record (read and schema-checked by the stream's reader):
        which events this VM's agent saw (present, or gone in this change: a vanished event was seen
        too). A heartbeat only pins the VM's identity."""
        if not isinstance(record, ScheduledEvents | Heartbeat) or record.vm is None or not record.vm.name:
            return
        vm = record.vm
        ref = VmRef.of(vm.subscription_id, vm.resource_group, vm.name, vm.resource_id)
        key = ref.key
        with self._lock:
            if not self._pinned(key, vm.resource_id, vm.vm_id) or not isinstance(record, ScheduledEvents):
                return
            ids = {e.event_id for e in record.events} | {c.event_id for c in record.changes}
            for event_id in ids:
                lowered = event_id.lower()
                if lowered not in self._events and self._ended_elsewhere(lowered):
                    continue  # settled: its findings are out
                state = self._event(event_id, now)
                if key not in state.agent_vms:
                    if state.agent_vms is _NO_AGENTS:
                        state.agent_vms = {}
                    state.agent_vms[key] = ref
                    azure_vm = state.azure_vms.get(key)
                    if azure_vm is None or _same_vm(azure_vm, ref):
                        state.unflag(key)
                    if state.azure_state is None:
                        self._check(now + self.grace, "agentOnly", state, key)

    # -- findings due ---------------------------------------------------------------------------------

    def due(self, now: float, limit: int | None = None) -> list[JsonObject]:
        """Findings whose grace ended (each once), at most ``limit`` of them (a backlog's grace ends
        for thousands of events within a second: the caller stores them a batch at a time, not all
        in memory at once); settled events and stale ones forgotten."""
        out: list[JsonObject] = []
        with self._lock:
            while self._checks and self._checks[0][0] <= now and (limit is None or len(out) < limit):
                _, kind, state, key = heapq.heappop(self._checks)
                if self._events.get(state.key) is not state:
                    continue  # forgotten meanwhile (its count went with it)
                finding = self._finding(kind, state.event_id, key, state, now)
                if finding is not None:
                    out.append(finding)
                state.checks -= 1
                if state.checks == 0:
                    self._in_grace -= 1
                    if state.ended_at is not None:  # settled: the tracker remembers it ended
                        self._drop(state.key)
            self._forget(now)
        return out

    def _finding(self, kind: Check, event_id: str, key: str, state: _Event, now: float) -> JsonObject | None:
        agents = sorted(state.agent_vms)
        if kind == "outcome":
            ended = str(state.azure_state).lower()
            detail = f"Azure says the event {ended}; {len(agents)} agent(s) reported it"
            return finding_record(
                "outcome", event_id, None, detail, now,
                grace_seconds=self.grace, azure_state=state.azure_state, agent_vms=agents,
            )  # fmt: skip
        if kind == "unwatched":
            vm = state.azure_vms[key]
            watcher = state.agent_vms.get(key)
            if watcher is not None and _same_vm(vm, watcher):
                return None  # its own agent, by the resource id Azure itself names
            state.flag(key)
            detail = f"no agent record of this event from {vm.name} within {self.grace:g} s of Azure's"
            return finding_record(
                "unwatched", event_id, vm, detail, now,
                grace_seconds=self.grace, azure_state=state.azure_state, agent_vms=agents,
            )  # fmt: skip
        if state.azure_state is not None:
            return None
        vm = state.agent_vms[key]
        detail = (
            f"Azure published nothing for this event within {self.grace:g} s of {vm.name}'s agent: the VM's "
            "scheduledEventsPolicy may not publish to Event Grid and Resource Graph (preview, off by default)"
        )
        return finding_record(
            "agentOnly",
            event_id,
            vm,
            detail,
            now,
            grace_seconds=self.grace,
            azure_state=None,
            agent_vms=agents,
        )

    def unwatched(self) -> list[JsonObject]:
        """The open unwatched VMs: Azure's event not ended, no agent record of it yet."""
        with self._lock:
            return [
                {"eventId": s.event_id, "azureState": s.azure_state, "vm": s.azure_vms[key].name,
                 "resourceId": s.azure_vms[key].resource_id}
                for s in self._events.values()
                if s.azure_state not in FINAL
                for key in sorted(s.flagged or ())
            ]  # fmt: skip

    def counts(self) -> tuple[int, int, int]:
        """(events known, open unwatched VMs, events in their grace): for the metrics."""
        with self._lock:
            open_flags = sum(
                len(s.flagged or ()) for s in self._events.values() if s.azure_state not in FINAL
            )
            return len(self._events), open_flags, self._in_grace

    # -- bookkeeping ----------------------------------------------------------------------------------

    def _pinned(self, key: str, resource_id: str, vm_id: str) -> bool:
        """Whether the record may speak for its VM: it names a resource id, and the VM's pinned vmId."""
        if not resource_id:
            self.refused["noResourceId"] += 1
            return False
        pinned = self._pins.get(key)
        if pinned is None:
            self._pins[key] = vm_id.lower()
            self._unsaved.append((key, vm_id.lower()))
            if len(self._pins) > self.max_vms:
                self._pins.popitem(last=False)
            return True
        if vm_id and pinned and vm_id.lower() != pinned:
            self.refused["changedClaim"] += 1
            return False
        return True

    def _event(self, event_id: str, now: float) -> _Event:
        key = event_id.lower()
        state = self._events.get(key)
        if state is None:
            # One string when the id is already lower case (a GUID usually is): 85 B an event.
            state = self._events[key] = _Event(key if key == event_id else event_id, key)
            if len(self._events) > self.max_events:
                self._drop(next(iter(self._events)))
        else:
            self._events.move_to_end(key)
        state.named_at = now
        return state

    def _check(self, due: float, kind: Check, state: _Event, key: str) -> None:
        if due == self._last_due:
            due = self._last_due  # the batch's other checks' float, not one more of 24 B
        else:
            self._last_due = due
        heapq.heappush(self._checks, (due, kind, state, key))
        state.checks += 1
        self._in_grace += state.checks == 1

    def _drop(self, key: str) -> None:
        state = self._events.pop(key)
        self._in_grace -= state.checks > 0

    def in_grace(self) -> int:
        """Events with findings still due: what a backlog read faster than the grace piles up (the
        service waits for them to settle past :data:`MAX_IN_GRACE`)."""
        with self._lock:
            return self._in_grace

    def save_pins(self) -> None:
        """Write the pins made since the last call (one fsync); compact a file grown past the pins it
        still holds. ``OSError`` when the disk refuses: kept for the next call."""
        if self._journal is None:
            return
        with self._lock:
            items, self._unsaved = self._unsaved, []
            try:
                self._journal.append(items, self._pins)
            except OSError:
                self._unsaved[:0] = items
                raise

    def _forget(self, now: float) -> None:
        while self._events:
            key, state = next(iter(self._events.items()))
            if now - state.named_at <= self.stale:
                break
            self._drop(key)


def _same_vm(azure: VmRef, agent: VmRef) -> bool:
    """The agent's resource id is the one Azure's event names for the VM (in either form a scale
    set's VM name may stand for: AzureEvent.vms)."""
    return azure.named_by(agent.resource_id)
