"""Many emulated VMs behind one server, with availability-set semantics (issue 11's fleet harness).

Why: a fleet of 100 VMs is what the approver and the central stream must hold, and 100 emulator
processes would cost more CPU and memory than the agents they serve. One process serves every VM
under its own path prefix (``/vm/<name>/metadata/scheduledevents``): the agent's ``--imds-url`` may
carry a path, so each agent talks to "its" IMDS exactly as on a VM.

What real IMDS does and this keeps (Scheduled Events documentation, "Event scope" and "Start an
event"):

* Each VM has its own document, its own ``DocumentIncarnation`` and its own request budget
  (5 requests/s): one :class:`EmulatorState` per VM.
* An event for an availability set names every affected VM in ``Resources`` and appears on the
  document of each of them, with the same ``EventId``.
* Approving it through any of those VMs lets it proceed for all: the POST is counted on the VM that
  made it; the others' copies are released without a count (``approve(posted=False)``).

The fleet ledger records, per event, when the first StartRequest arrived, through which VM, and how
many POSTs named it in total: the harness's "decision published -> StartRequest" clock and its
"doubled" count.
"""

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .profile import VmProfile
from .state import ConflictError, EmulatorState

# Bounded bookkeeping: a long harness run must not grow memory without limit.
_EVENT_LIMIT = 20_000


@dataclass(slots=True)
class FleetEvent:
    """One event as the fleet saw it: where it appeared and how it was approved."""

    event_id: str
    resources: tuple[str, ...]
    served: tuple[str, ...]  # the named VMs this emulator serves (others are outside the fleet)
    added_at: float
    first_start_request_at: float | None = None
    first_start_request_via: str | None = None
    start_requests: int = 0  # POSTs naming it, over every VM

    def view(self) -> dict[str, object]:
        return {
            "eventId": self.event_id,
            "resources": list(self.resources),
            "addedAt": self.added_at,
            "firstStartRequestAt": self.first_start_request_at,
            "firstStartRequestVia": self.first_start_request_via,
            "startRequests": self.start_requests,
        }


def fleet_profiles(count: int, prefix: str = "fleet-vm-", first_ip: str = "127.0.1.1") -> list[VmProfile]:
    """``count`` standalone VMs ``<prefix>000``.. with consecutive private IPs from ``first_ip``.

    The default IPs are loopback addresses (all of 127/8 reaches this host on Linux), so a fleet
    approver's ``http://{privateIp}:8710`` template reaches each VM's agent on one machine.
    """
    if not 1 <= count <= 10_000:
        raise ValueError("a fleet has 1 to 10000 VMs")
    octets = [int(o) for o in first_ip.split(".")]
    if len(octets) != 4 or not all(0 <= o <= 255 for o in octets):
        raise ValueError(f"not an IPv4 address: {first_ip!r}")
    base = (octets[0] << 24) | (octets[1] << 16) | (octets[2] << 8) | octets[3]
    width = max(3, len(str(count - 1)))
    profiles = []
    for index in range(count):
        ip = base + index
        dotted = ".".join(str((ip >> shift) & 255) for shift in (24, 16, 8, 0))
        profiles.append(VmProfile(name=f"{prefix}{index:0{width}d}", private_ip=dotted))
    return profiles


class Fleet:
    """The VMs of a fleet emulator and the events they share."""

    def __init__(self, profiles: list[VmProfile], **state_options: Any) -> None:
        names = [p.compute_name for p in profiles]
        if len(set(names)) != len(names):
            raise ValueError("fleet VM names must be unique")
        self.states: dict[str, EmulatorState] = {
            p.compute_name: EmulatorState(vm=p, **state_options) for p in profiles
        }
        self._lock = threading.Lock()
        self._events: OrderedDict[str, FleetEvent] = OrderedDict()  # key: upper-case EventId

    def add_event(self, *, resources: list[str], event_id: str | None = None, **options: Any) -> str:
        """One event on the document of every served VM in ``resources`` (same EventId everywhere).

        ``options`` are :meth:`EmulatorState.add_event`'s (eventType, notice, ...). VMs named but
        not served stand for VMs of the set without the agent: named, never polled.
        """
        served = tuple(name for name in dict.fromkeys(resources) if name in self.states)
        if not served:
            raise ValueError("resources must name at least one VM of this fleet")
        event_id = event_id or str(uuid.uuid4()).upper()
        with self._lock:
            if event_id.upper() in self._events:  # checked first: no VM may get half of an event
                raise ConflictError(f"eventId {event_id} was already used")
        added_at = time.time()
        for name in served:
            self.states[name].add_event(event_id=event_id, resources=list(resources), **options)
        with self._lock:
            self._events[event_id.upper()] = FleetEvent(event_id, tuple(resources), served, added_at)
            while len(self._events) > _EVENT_LIMIT:
                self._events.popitem(last=False)
        return event_id

    def approve(self, vm_name: str, event_ids: list[str]) -> None:
        """A StartRequests POST made by ``vm_name``: counted there, released on every VM of the events."""
        stamp = time.time()
        self.states[vm_name].approve(event_ids)
        released: dict[str, list[str]] = {}
        with self._lock:
            for key in dict.fromkeys(i.upper() for i in event_ids):
                event = self._events.get(key)
                if event is None:
                    continue
                event.start_requests += 1
                if event.first_start_request_at is None:
                    event.first_start_request_at, event.first_start_request_via = stamp, vm_name
                for name in event.served:
                    if name != vm_name:
                        released.setdefault(name, []).append(key)
        for name, ids in released.items():
            self.states[name].approve(ids, posted=False)

    def snapshot_event(self, event_id: str) -> dict[str, object]:
        with self._lock:
            return self._events[event_id.upper()].view()

    def snapshot(self) -> dict[str, object]:
        """``GET /_emulator/fleet``: every VM's request counters and every event's approval."""
        vms = []
        totals: dict[str, Any] = {"get": 0, "post": 0, "rejected": {}}
        for name, state in self.states.items():
            requests = state.request_counts()
            totals["get"] += requests["get"]
            totals["post"] += requests["post"]
            for status, count in requests["rejected"].items():
                totals["rejected"][status] = totals["rejected"].get(status, 0) + count
            vms.append({"name": name, "privateIp": state.vm.private_ip, "requests": requests})
        with self._lock:
            events = [event.view() for event in self._events.values()]
        return {"vms": vms, "events": events, "requests": totals}

    def run_tickers(self) -> list[threading.Thread]:
        """One ticker per VM (each sleeps until its own next deadline: no polling)."""
        threads = [
            threading.Thread(target=state.run_ticker, name=f"imds-emulator-ticker-{name}", daemon=True)
            for name, state in self.states.items()
        ]
        for thread in threads:
            thread.start()
        return threads

    def stop_tickers(self) -> None:
        for state in self.states.values():
            state.stop_ticker()
