"""``heartbeat`` records (``schemas/heartbeat.v1.schema.json``): the agent is alive and watching,
every ``--heartbeat-interval`` seconds. scheduledEvents records come only with changes, so without it
a quiet VM and a dead agent look the same. It restates the open events in short (issue 34): Azure
announces some days ahead, and an Azure Monitor alert looks back at most 2 days."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.records.fields import Envelope, check, stamp, vm_of
from bridge.records.ids import HEARTBEAT, derived_id, envelope
from bridge.records.scheduled_events import events_view
from bridge.schemas import JsonObject, load_schema

if TYPE_CHECKING:  # the writer's types; readers (sinks, services) never load the IMDS layer
    from bridge.imds.document import EventsDocument
    from bridge.imds.instance import VmIdentity


SCHEMA = "heartbeat.v1.schema.json"
#: Events a heartbeat restates at most (``openEvents`` counts them all): a bound on its size, the
#: schema's (read from it: one number, one place).
MAX_EVENTS: int = load_schema(SCHEMA)["properties"]["events"]["maxItems"]
#: What a heartbeat keeps of each event: enough for an alert to see an event announced days ahead
#: (issue 34), not its resources (a Freeze of a whole availability set names every VM).
SHORT = ("eventId", "eventType", "eventStatus", "notBefore", "affectsThisVm")


def build(
    vm: VmIdentity,
    document: EventsDocument | None,
    imds_ok: bool,
    interval: float,
    now: float,
) -> JsonObject:
    """One per interval, its id derived from the VM and the interval's number, so a heartbeat sent
    again after a crash is the same."""
    slot = int(now // interval)
    events = [] if document is None else events_view(vm, document)[:MAX_EVENTS]
    return {
        **envelope(HEARTBEAT, derived_id(vm.key, "heartbeat", f"{interval:g}", str(slot)), now, vm),
        "intervalSeconds": interval,
        "documentIncarnation": None if document is None else document.incarnation,
        "openEvents": 0 if document is None else len(document.events),
        "events": [{key: event[key] for key in SHORT} for event in events],
        "imdsOk": imds_ok,
    }


@dataclass(frozen=True, slots=True)
class Heartbeat(Envelope):
    interval: float
    incarnation: int | None
    open_events: int
    imds_ok: bool


def read(raw: Mapping[str, object]) -> Heartbeat:
    f = check(raw, SCHEMA)
    return Heartbeat(
        record_id=f.string("recordId"),
        observed_at=stamp(raw["observedAt"]),
        vm=vm_of(raw["vm"]),
        interval=f.number("intervalSeconds"),
        incarnation=f.opt_integer("documentIncarnation"),
        open_events=f.integer("openEvents"),
        imds_ok=f.boolean("imdsOk"),
    )
