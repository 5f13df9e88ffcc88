"""What a fleet approver knows of the fleet: its VMs and their events, learned from the events
stream, bounded, forgotten when over, and not believed blindly.

The events stream is written by every agent: any VM (or anything holding a VM's publish
credential) can put any record on it. So what a record *claims* is treated as a claim:

* **Pinned on first sight.** A VM's identity (``vmId``, ``resourceId``, ``privateIp``) is recorded
  the first time its name is seen, in the state directory (``fleet-pins.jsonl``, kept across
  restarts: a restart must not be the moment to swap an address). A later record claiming another
  identity for that name, or that vmId for another name, is refused, counted
  (``se_bridge_approver_fleet_claims_refused_total{reason}``) and logged at error, never followed:
  a poisoned ``privateIp`` would send signed relay requests elsewhere, a poisoned ``resourceId``
  would move the ARM acknowledgement to another scope. An operator who really moved a VM removes its
  line from the file (docs/security.md).
* **Bounded per publisher and fleet-wide** (issue 31, finding 7). A record names at most
  ``MAX_EVENTS_PER_RECORD`` events and an event at most ``MAX_RESOURCES`` VMs (an availability set
  holds at most 200); names longer than Azure allows are refused. A VM speaks only for the events
  that name it (``notNamed``), and all events together name at most ``RESOURCE_BUDGET`` VMs
  (``overBudget``): one pinned name re-publishing 32 events of 500 made-up names cost 2.3 MB a record
  before. A first-sight ``resourceId`` must end with the claimed VM's name (``nameMismatch``).
* **Pins expire, the fleet never stays full.** The fleet holds at most ``max_vms`` VMs. When it is
  full, the pin of a VM that has shown nothing for ``IDLE_PIN`` seconds and no open event makes room
  (the oldest pins first): 200 000 made-up names no longer lock real VMs out for good, restart
  included. Above ``HIGH_WATER`` of ``max_vms`` an error is logged (alert on
  ``se_bridge_approver_fleet_vms``); ``fleetFull`` is refused only while every pin is live.
* **Forgotten when over.** An event is kept while some VM's latest record still shows it; once
  none does, or a day past its ``NotBefore`` (``FORGET_AFTER``), it is dropped. Memory therefore
  follows the fleet and its open events, not the history of the stream (issue 23: it used to keep
  every event ever seen).

Values are interned and kept in slotted objects: 100 000 VMs cost tens of megabytes, not hundreds.
"""

from __future__ import annotations

import ipaddress
import logging
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bridge.azure_ids import ScopeRefused, event_scope, parent_scope
from bridge.eligibility import EventFacts
from bridge.records.azure import AzureEvent, Finding
from bridge.records.scheduled_events import ScheduledEvents
from bridge.signing import KeyRing
from bridge.support.fsutil import write_atomic
from bridge.support.observability import RateLimitedLog
from bridge.support.timeutil import epoch_of

log = logging.getLogger(__name__)

MAX_EVENTS_PER_RECORD = 32
MAX_RESOURCES = 1000
MAX_NAME = 128
#: Events whose parent Azure's channel named, remembered at most (the oldest forgotten first).
MAX_PARENTS = 100_000
#: An event is dropped this long after its NotBefore even if a silent VM still lists it.
FORGET_AFTER = 86400.0
#: How often the forgetting sweep runs (seconds).
SWEEP_EVERY = 60.0
PINS_FILE = "fleet-pins.jsonl"
#: All events together name at most this many VMs (references; about 8 bytes each, names interned).
RESOURCE_BUDGET = 2_000_000
#: A pin silent this long, with no open event, may make room for a new VM when the fleet is full.
IDLE_PIN = 3600.0
#: Of max_vms: above it, the fleet's size is logged as an error (a flood of made-up names?).
HIGH_WATER = 0.9
#: Pins looked at, oldest first, for one that may make room (a bounded scan, not the whole fleet).
EVICTION_SCAN = 10_000


class Vm:
    """A VM as the fleet knows it, stored compactly (100 000 of them must fit in tens of MB): the
    vmId as 16 bytes, the address packed, the resource id as an interned prefix (the subscription
    and group most VMs share) and its own tail. The properties give the usual text back."""

    __slots__ = ("_id", "_ip", "_prefix", "_tail", "events", "name", "seen")

    def __init__(self, name: str, vm_id: str = "", resource_id: str = "", private_ip: str = "") -> None:
        self.name = sys.intern(name)
        self._id = _packed_id(vm_id)
        self._ip = ipaddress.ip_address(private_ip).packed if private_ip else b""
        prefix, sep, tail = resource_id.rpartition("/providers/Microsoft.Compute/")
        self._prefix = sys.intern(prefix + sep) if sep else ""
        self._tail = tail if sep else resource_id
        self.events: tuple[str, ...] = ()  # the event ids of its latest record
        self.seen = 0.0  # when its latest record was learned (pins loaded at start: the start)

    @property
    def vm_id(self) -> str:
        return str(uuid.UUID(bytes=self._id)) if len(self._id) == 16 else self._id.decode()

    @property
    def resource_id(self) -> str:
        return self._prefix + self._tail

    @property
    def private_ip(self) -> str:
        return str(ipaddress.ip_address(self._ip)) if self._ip else ""

    def differs(self, other: Vm) -> list[str]:
        """The identity fields both know and that differ."""
        pairs = {"vmId": (self._id, other._id), "privateIp": (self._ip, other._ip),
                 "resourceId": (self.resource_id.encode(), other.resource_id.encode())}  # fmt: skip
        return [k for k, (a, b) in pairs.items() if a and b and a != b]

    def fill(self, other: Vm) -> None:
        """Take what this pin lacked from ``other`` (never overwrite)."""
        self._id = self._id or other._id
        self._ip = self._ip or other._ip
        if not self._tail:
            self._prefix, self._tail = other._prefix, other._tail


def _packed_id(vm_id: str) -> bytes:
    try:
        return uuid.UUID(vm_id).bytes if vm_id else b""
    except ValueError:
        return vm_id.lower().encode()


@dataclass(slots=True)
class Event:
    resources: tuple[str, ...]
    status: str
    not_before: float | None
    first_seen: float
    reporters: int = 0  # VMs whose latest record shows it

    def facts(self) -> EventFacts:
        return EventFacts(self.status, self.resources)


@dataclass(slots=True)
class AzureFacts:
    """What Azure's own channel said of an event (bridge.azure): hints for the ARM path."""

    parent: str  # the VM, scale set or availability set the event is under
    status: str
    resources: tuple[str, ...]
    vms: dict[str, str]  # lower-cased name -> resource id
    unwatched: set[str]  # lower-cased names no agent reports (reconciliation findings)


class ClaimRefused(Exception):
    """A record's claim the fleet does not believe (``reason``: a bounded word for the metric)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class FleetView:
    def __init__(
        self,
        state_dir: Path | None,
        *,
        max_vms: int = 200_000,
        pin: bool = True,
        on_refused: Any = None,
        azure_keys: KeyRing | None = None,
    ) -> None:
        self.azure_keys = azure_keys or KeyRing()  # empty: Azure's channel is not used
        self._lock = threading.Lock()
        self._vms: dict[str, Vm] = {}  # lower-cased name -> Vm
        self._by_id: dict[bytes, str] = {}  # packed vmId -> lower-cased name
        self._events: dict[str, Event] = {}  # upper-cased EventId -> Event
        self._azure: OrderedDict[str, AzureFacts] = OrderedDict()  # upper-cased EventId -> Azure's word
        self.max_vms = max_vms
        self.pin = pin
        self._pins = PinFile(None if state_dir is None or not pin else state_dir / PINS_FILE)
        self.on_refused = on_refused  # reason -> None (a metric)
        self._refusals = RateLimitedLog(log, every=60.0, level=logging.ERROR)
        self._swept = time.monotonic()
        self._refs = 0  # VM names all events together name (RESOURCE_BUDGET)
        self._pins_dirty = False  # a pin was forgotten: the file is rewritten at the next sweep
        self._high_water_logged = False
        for vm in self._pins.load():
            self._vms[vm.name.lower()] = vm
            if vm._id:
                self._by_id[vm._id] = vm.name.lower()
        now = time.time()
        for vm in self._vms.values():
            vm.seen = now  # a loaded pin is idle from this start on, not from before it
        self._rewrite_pins()  # compacted: one line per VM, whatever the file went through

    # -- what the router and the coordinator ask -------------------------------------------------

    def vm(self, name: str) -> Vm | None:
        key = name.lower()
        with self._lock:
            vm = self._vms.get(key)
            if vm is None:
                owner = self._by_id.get(_packed_id(key))
                vm = self._vms.get(owner) if owner is not None else None
            return vm

    def event(self, event_id: str) -> Event | None:
        """The event as the agents reported it; as Azure's channel did when no agent reported it."""
        with self._lock:
            event = self._events.get(event_id.upper())
            azure = self._azure.get(event_id.upper()) if event is None else None
        if azure is not None and azure.status:
            return Event(azure.resources, azure.status, None, 0.0)
        return event

    def azure_parent(self, event_id: str) -> str | None:
        with self._lock:
            azure = self._azure.get(event_id.upper())
            return azure.parent if azure is not None else None

    def azure_vm(self, event_id: str, name: str) -> Vm | None:
        """A VM of the event as Azure's channel named it (its resource id; no agent, no address)."""
        with self._lock:
            azure = self._azure.get(event_id.upper())
            resource_id = azure.vms.get(name.lower()) if azure is not None else None
        return Vm(name, resource_id=resource_id) if resource_id else None

    def unwatched(self, event_id: str, name: str) -> bool:
        """Whether Azure's reconciliation found no agent reporting this event on this VM."""
        with self._lock:
            azure = self._azure.get(event_id.upper())
            return azure is not None and name.lower() in azure.unwatched

    def learn_azure(self, record: AzureEvent) -> None:
        """An ``azureScheduledEvent`` record (bridge.azure): the event's parent, the scope the ARM path
        acknowledges on. Learned only when the azure-channel service signed it (``--azure-key``,
        verified by the stream's reader: every agent writes to the stream); its ids must follow
        Azure's grammar too (checked again, with the allowed scopes, when a URL is made), and ARM
        refuses an event that is not under the scope named (404, audited)."""
        if not self._proven(record):
            return
        event_id, parent = record.event.event_id, record.parent_id
        if len(event_id) > MAX_NAME:
            return
        try:
            parent_scope(parent)
            vms = {v.key: v.resource_id for v in record.vms if event_scope(v.resource_id)}
        except ScopeRefused as exc:
            self._refused(ClaimRefused("malformed", str(exc)), None)
            return
        with self._lock:
            known = self._azure.pop(event_id.upper(), None)
            unwatched = known.unwatched if known is not None else set()
            self._azure[event_id.upper()] = AzureFacts(
                parent, record.state, record.event.resources, vms, unwatched
            )
            while len(self._azure) > MAX_PARENTS:
                self._azure.popitem(last=False)

    def learn_finding(self, record: Finding) -> None:
        """A reconciliation finding (bridge.azure): a VM of an event Azure announced that no agent
        reports, signed like the azure records: it lets the ARM path act at once for a VM without an agent
        instead of waiting for agents that are not there; the rule and ARM still decide."""
        if not self._proven(record) or record.finding != "unwatched" or record.vm is None:
            return
        with self._lock:
            azure = self._azure.get(record.event_id.upper())
            if azure is not None and len(azure.unwatched) < MAX_RESOURCES:
                azure.unwatched.add(record.vm.key)

    def counts(self) -> tuple[int, int]:
        """(VMs, events) known: the ``se_bridge_approver_fleet_*`` gauges."""
        with self._lock:
            return len(self._vms), len(self._events)

    # -- learning ---------------------------------------------------------------------------------

    def learn(self, record: ScheduledEvents, now: float | None = None) -> Vm | None:
        """Take one ``scheduledEvents`` record (schema-checked by the reader); the VM it is from, or
        None when refused."""
        now = time.time() if now is None else now
        try:
            vm = self._claimed_vm(record)
            events = _events_of(record, now)
            with self._lock:
                entry = self._pinned(vm, now)
                self._replace_events(entry, _named(entry, events), now)
        except ClaimRefused as refused:
            self._refused(refused, record)
            return None
        self._sweep(now)
        return entry

    def _claimed_vm(self, record: ScheduledEvents) -> Vm:
        block = record.vm
        if block is None or not block.name:
            raise ClaimRefused("malformed", "record without a VM name")
        private_ip = block.private_ip
        if private_ip:
            try:  # an address, nothing else: it is formatted into the relay URL
                private_ip = str(ipaddress.ip_address(private_ip))
            except ValueError:
                raise ClaimRefused("malformed", "privateIp is not an IP address") from None
        if len(block.resource_id) > 512:
            raise ClaimRefused("malformed", "resourceId too long")
        return Vm(block.name, block.vm_id, block.resource_id, private_ip)

    def _pinned(self, claim: Vm, now: float) -> Vm:
        """The VM as pinned, after checking ``claim`` against it (lock held)."""
        key = claim.name.lower()
        known = self._vms.get(key)
        if known is None:
            owner = self._by_id.get(claim._id) if claim._id else None
            if owner is not None and owner != key and self.pin:
                raise ClaimRefused("changedClaim", f"vmId {claim.vm_id} already belongs to {owner}")
            if claim.resource_id and not _names_itself(claim):
                raise ClaimRefused("nameMismatch", f"resourceId does not end with {claim.name}")
            if len(self._vms) >= self.max_vms and not self._make_room(now):
                raise ClaimRefused("fleetFull", f"the fleet holds {self.max_vms} VMs, none idle")
            self._high_water()
            claim.seen = now
            self._vms[key] = claim
            if claim._id:
                self._by_id[claim._id] = key
            self._pins.append(claim)
            log.debug("fleet: VM learned", extra={"vmName": claim.name, "privateIp": claim.private_ip})
            return claim
        changed = known.differs(claim)
        if changed and self.pin:
            raise ClaimRefused("changedClaim", f"{claim.name}: {', '.join(changed)} differ from the pin")
        known.fill(claim)
        known.seen = now
        return known

    def _make_room(self, now: float) -> bool:
        """Forget the oldest pin silent for IDLE_PIN with no open event (lock held); False if none."""
        for scanned, (key, vm) in enumerate(self._vms.items()):
            if scanned >= EVICTION_SCAN:
                break
            if not vm.events and now - vm.seen >= IDLE_PIN:
                del self._vms[key]
                if vm._id and self._by_id.get(vm._id) == key:
                    del self._by_id[vm._id]
                self._pins_dirty = True
                log.warning("fleet: an idle pin forgotten to make room", extra={"vmName": vm.name})
                return True
        return False

    def _high_water(self) -> None:
        if len(self._vms) + 1 >= HIGH_WATER * self.max_vms and not self._high_water_logged:
            self._high_water_logged = True
            log.error(
                "fleet: the fleet view is nearly full (a flood of made-up VM names?); idle pins make room",
                extra={"vms": len(self._vms) + 1, "maxVms": self.max_vms},
            )

    def _replace_events(self, vm: Vm, events: list[tuple[str, Event]], now: float) -> None:
        """The VM's latest record shows ``events``: update them, and drop the VM from the events
        it no longer shows (an event no VM shows any more is over)."""
        shown = tuple(event_id for event_id, _ in events)
        before = set(vm.events)
        added = sum(
            len(fresh.resources) - len(self._events[e].resources)
            if e in self._events
            else len(fresh.resources)
            for e, fresh in events
        )
        if added > 0 and self._refs + added > RESOURCE_BUDGET:
            raise ClaimRefused("overBudget", f"the fleet's events already name {self._refs} VMs")
        for event_id in before - set(shown):
            self._unreport(event_id)
        for event_id, fresh in events:
            known = self._events.get(event_id)
            if known is None:
                self._events[event_id] = known = fresh
                self._refs += len(fresh.resources)
            else:
                self._refs += len(fresh.resources) - len(known.resources)
                known.status, known.resources = fresh.status, fresh.resources
                known.not_before = fresh.not_before if fresh.not_before is not None else known.not_before
            if event_id not in before:
                known.reporters += 1
        vm.events = shown

    def _unreport(self, event_id: str) -> None:
        event = self._events.get(event_id)
        if event is None:
            return
        event.reporters -= 1
        if event.reporters <= 0:
            del self._events[event_id]
            self._refs -= len(event.resources)

    def _sweep(self, now: float) -> None:
        """Drop events a day past their NotBefore (or first sight): a VM that went silent while
        showing one must not keep it for ever."""
        if time.monotonic() - self._swept < SWEEP_EVERY:
            return
        self._swept = time.monotonic()
        if self._pins_dirty:
            self._rewrite_pins()
        with self._lock:
            stale = [
                event_id for event_id, e in self._events.items()
                if (e.not_before if e.not_before is not None else e.first_seen) + FORGET_AFTER < now
            ]  # fmt: skip
            if not stale:
                return
            for event_id in stale:
                self._refs -= len(self._events.pop(event_id).resources)
            gone = set(stale)
            for vm in self._vms.values():  # once per sweep that found stale events: cheap enough
                if vm.events and gone.intersection(vm.events):
                    vm.events = tuple(e for e in vm.events if e not in gone)

    def _rewrite_pins(self) -> None:
        with self._lock:
            vms = list(self._vms.values())
            self._pins_dirty = False
        self._pins.rewrite(vms)

    def _proven(self, record: AzureEvent | Finding) -> bool:
        """Whether the azure-channel service signed the record (``--azure-key``; the reader verified
        it): every agent writes to the events stream, so an unsigned or forged record would choose
        where an approval goes (issue 23); it is refused and counted, never learned."""
        if not self.azure_keys:
            return False  # Azure's channel is not used
        if record.signed_by is None:
            self._refused(ClaimRefused("unproven", "not signed by a known azure-channel key"), None)
            return False
        return True

    def _refused(self, refused: ClaimRefused, record: ScheduledEvents | None) -> None:
        if self.on_refused is not None:
            self.on_refused(refused.reason)
        shown = record.vm.name if record is not None and record.vm is not None else None
        if refused.reason == "changedClaim":  # each one: another party speaking in a pinned VM's name
            log.error(
                "fleet: a record claims another identity for a pinned VM (refused)",
                extra={"detail": str(refused)[:300], "vmName": shown},
            )
            return
        self._refusals.log(
            "fleet: a record's claim refused (not learned)",
            reason=refused.reason,
            detail=str(refused)[:300],
            vmName=shown,
        )


class PinFile:
    """``fleet-pins.jsonl``: one VM's pinned identity a line, appended at first sight (no fsync: a pin
    lost in a crash is pinned again at the VM's next record), rewritten compacted at each start and
    when pins were forgotten. ``path`` None: nothing is kept (a view without a state directory)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def load(self) -> list[Vm]:
        if self.path is None:
            return []
        vms = []
        try:
            with open(self.path, "rb") as pins:  # line by line: the file is never whole in memory
                for line in pins:
                    try:
                        data = orjson.loads(line)
                        vms.append(
                            Vm(
                                str(data["name"]),
                                str(data["vmId"]),
                                str(data["resourceId"]),
                                str(data["privateIp"]),
                            )
                        )
                    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                        continue  # a torn last line after a crash: pinned again on the VM's next record
        except FileNotFoundError:
            return []
        return vms

    def rewrite(self, vms: Iterable[Vm]) -> None:
        if self.path is None:
            return

        def chunks() -> Iterator[bytes]:  # 256 KiB at a time (issue 33: joined, it was the restart's peak)
            lines: list[bytes] = []
            size = 0
            for vm in vms:
                line = _pin_line(vm)
                lines.append(line)
                size += len(line)
                if size >= 1 << 18:
                    yield b"".join(lines)
                    lines, size = [], 0
            yield b"".join(lines)

        try:
            write_atomic(self.path, chunks())
        except OSError as exc:  # the forgotten pins come back at a restart, and idle out again
            log.error("fleet: pins not rewritten", extra={"error": str(exc)})

    def append(self, vm: Vm) -> None:
        if self.path is None:
            return
        try:
            with open(self.path, "ab") as pins:
                pins.write(_pin_line(vm))
        except OSError as exc:  # kept in memory; pinned again from its next record after a restart
            log.error("fleet: pin not saved", extra={"error": str(exc), "vmName": vm.name})


def _names_itself(vm: Vm) -> bool:
    """Whether a resource id's last segment is the VM's name: a VM's own (``.../virtualMachines/vm1``),
    or a Uniform scale-set instance's (``.../virtualMachineScaleSets/ss/virtualMachines/3`` for ``ss_3``)."""
    parts = vm.resource_id.rstrip("/").split("/")
    last, name = parts[-1].lower(), vm.name.lower()
    if last == name:
        return True
    return (
        len(parts) >= 4
        and parts[-4].lower() == "virtualmachinescalesets"
        and name == f"{parts[-3]}_{last}".lower()
    )


def _named(vm: Vm, events: list[tuple[str, Event]]) -> list[tuple[str, Event]]:
    """The events of a VM's record that name it: a VM speaks only for its own events."""
    mine = vm.name.lower()
    named = [(e, fresh) for e, fresh in events if any(r.lower() == mine for r in fresh.resources)]
    if len(named) != len(events):
        raise ClaimRefused("notNamed", f"{vm.name} reports an event that does not name it")
    return named


def _pin_line(vm: Vm) -> bytes:
    data = {"name": vm.name, "vmId": vm.vm_id, "resourceId": vm.resource_id, "privateIp": vm.private_ip}
    return orjson.dumps(data) + b"\n"


def _events_of(record: ScheduledEvents, now: float) -> list[tuple[str, Event]]:
    if len(record.events) > MAX_EVENTS_PER_RECORD:
        raise ClaimRefused(
            "tooManyEvents", f"{len(record.events)} events in a record (at most {MAX_EVENTS_PER_RECORD})"
        )
    return [
        (
            sys.intern(e.event_id.upper()),
            Event(e.resources, sys.intern(e.status[:32]), epoch_of(e.not_before), now),
        )
        for e in record.events
    ]
