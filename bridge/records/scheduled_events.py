"""``scheduledEvents`` records (``schemas/record.v1.schema.json``): one document change seen by an
agent. Built here by the agent's poller; read here by every consumer (the console's board, the fleet
approver's view, Azure's channel reconciling, chat formats)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bridge.records.fields import (
    Envelope,
    check,
    name,
    names,
    optional_int,
    optional_text,
    stamp,
    text,
    vm_of,
)
from bridge.records.ids import SCHEDULED_EVENTS, derived_id, envelope
from bridge.schemas import JsonObject, json_list

if TYPE_CHECKING:  # the writer's types; readers (sinks, services) never load the IMDS layer
    from bridge.imds.document import EventsDocument
    from bridge.imds.instance import VmIdentity


SCHEMA = "record.v1.schema.json"


class Transition(Protocol):
    """One event's change between two documents (``bridge.agent.diff.Change``)."""

    def to_json(self) -> JsonObject: ...


def record_id(vm_key: str, previous: EventsDocument | None, current: EventsDocument) -> str:
    """Derived from *what changed*, never from when it was seen: the VM, and the (incarnation,
    content digest) of the documents before and after. The same change gets the same id after a
    crash, a restart or a resend; a different change can never reuse one."""
    before = "initial" if previous is None else f"{previous.incarnation}:{previous.digest}"
    return derived_id(vm_key, before, f"{current.incarnation}:{current.digest}")


def events_view(vm: VmIdentity, document: EventsDocument) -> list[JsonObject]:
    """The document's events as records carry them: normalized, with ``affectsThisVm``."""
    vm_names = vm.names()
    return [{**e.to_json(), "affectsThisVm": vm.affects(e.resources, vm_names)} for e in document.events]


def build(
    vm: VmIdentity,
    previous: EventsDocument | None,
    current: EventsDocument,
    changes: Iterable[Transition],
    observed_at: float,
) -> JsonObject:
    return {
        **envelope(
            SCHEDULED_EVENTS, record_id(vm.key, previous, current), observed_at, vm, current.api_version
        ),
        "documentIncarnation": current.incarnation,
        "previousIncarnation": None if previous is None else previous.incarnation,
        "events": json_list(events_view(vm, current)),
        "changes": json_list(c.to_json() for c in changes),
        "raw": current.raw,
    }


def document_view(vm: VmIdentity, document: EventsDocument, observed_at: float) -> JsonObject:
    """``GET /v1/document``: the current document, as a record would show it."""
    from bridge.support.timeutil import rfc3339

    return {
        "observedAt": rfc3339(observed_at),
        "documentIncarnation": document.incarnation,
        "vm": vm.to_record(),
        "events": json_list(events_view(vm, document)),
    }


@dataclass(frozen=True, slots=True)
class EventView:
    """One event as a record shows it. ``event_id`` as IMDS spelled it: a consumer that joins on it
    case-folds it itself, and one that relays it (the coordinator) must send it back unchanged."""

    event_id: str
    event_type: str
    status: str
    resources: tuple[str, ...]
    not_before: str | None
    description: str | None
    source: str | None
    duration: int | None
    affects_this_vm: bool = False


@dataclass(frozen=True, slots=True)
class ChangeView:
    """One event's change in this record: ``change`` one of the schema's words."""

    event_id: str
    change: str
    event_type: str
    previous_status: str | None
    status: str | None


@dataclass(frozen=True, slots=True)
class ScheduledEvents(Envelope):
    incarnation: int
    previous_incarnation: int | None
    events: tuple[EventView, ...]
    changes: tuple[ChangeView, ...]

    def change_of(self, event_id: str) -> ChangeView | None:
        """This record's change of ``event_id`` (compared case-insensitively)."""
        wanted = event_id.upper()
        return next((c for c in self.changes if c.event_id.upper() == wanted), None)


def event_of(item: Mapping[str, object]) -> EventView:
    """An event block (the shape of record.v1's ``$defs/event``, also Azure's channel's ``event``)."""
    return EventView(
        event_id=sys.intern(str(item["eventId"])),
        event_type=name(item.get("eventType")),
        status=name(item.get("eventStatus")),
        resources=names(item.get("resources")),
        not_before=optional_text(item.get("notBefore"), 64),
        description=optional_text(item.get("description"), 512),
        source=optional_text(item.get("eventSource"), 64),
        duration=optional_int(item.get("durationInSeconds")),
        affects_this_vm=item.get("affectsThisVm") is True,
    )


def read(raw: Mapping[str, object]) -> ScheduledEvents:
    f = check(raw, SCHEMA)
    return ScheduledEvents(
        record_id=f.string("recordId"),
        observed_at=stamp(raw["observedAt"]),
        vm=vm_of(raw["vm"], schema=False),
        incarnation=f.integer("documentIncarnation"),
        previous_incarnation=f.opt_integer("previousIncarnation"),
        events=tuple(event_of(e.raw) for e in f.objs("events")),
        changes=tuple(
            ChangeView(
                event_id=sys.intern(c.string("eventId")),
                change=c.string("change"),
                event_type=text(c.string("eventType"), 64),
                previous_status=c.opt_string("previousStatus"),
                status=c.opt_string("eventStatus"),
            )
            for c in f.objs("changes")
        ),
    )
