"""Reading what Azure's channel publishes (``azureScheduledEvent``, ``reconciliation``; written by
:mod:`bridge.azure.records`, whose builders need the channel's own types). Both are signed by the
channel's ``--sign-key``: every agent writes to the same stream, so an unsigned "unwatched" or
"Completed" could be anybody's. The :class:`~bridge.records.reader.Reader` verifies the signature
once and says by which key in ``signed_by``; a consumer acts only on a record with one."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from bridge.records.fields import MAX_RESOURCE_ID, Envelope, VmRef, azure_vm_of, bounded, check, stamp, text
from bridge.records.scheduled_events import EventView, event_of

AZURE_EVENT_SCHEMA = "azure-event.v1.schema.json"
RECONCILIATION_SCHEMA = "reconciliation.v1.schema.json"


@dataclass(frozen=True, slots=True)
class AzureEvent(Envelope):
    event: EventView
    resource_id: str  # the event's own ARM id
    parent_id: str  # the VM, scale set or availability set whose event it is
    vms: tuple[VmRef, ...]
    state: str  # Scheduled, Started, Completed, Canceled
    late: bool
    signed_by: str | None = None


@dataclass(frozen=True, slots=True)
class Finding(Envelope):
    finding: str  # unwatched, outcome, agentOnly
    event_id: str
    azure_state: str | None
    agent_vms: tuple[str, ...]
    grace_seconds: float
    detail: str
    signed_by: str | None = None


def read_event(raw: Mapping[str, object], signed_by: str | None = None) -> AzureEvent:
    f = check(raw, AZURE_EVENT_SCHEMA)
    event = f.obj("event")
    return AzureEvent(
        record_id=f.string("recordId"),
        observed_at=stamp(raw["observedAt"]),
        vm=None,
        event=event_of(event.raw),
        resource_id=bounded(event.string("resourceId"), MAX_RESOURCE_ID, "event.resourceId"),
        # The scope an ARM acknowledgement goes to: refused when too long, never cut.
        parent_id=bounded(event.string("parentId"), MAX_RESOURCE_ID, "event.parentId"),
        vms=tuple(azure_vm_of(v.raw) for v in f.objs("vms")),
        state=f.string("state"),
        late=f.boolean("late"),
        signed_by=signed_by,
    )


def read_finding(raw: Mapping[str, object], signed_by: str | None = None) -> Finding:
    f = check(raw, RECONCILIATION_SCHEMA)
    vm = f.opt_obj("vm")
    return Finding(
        record_id=f.string("recordId"),
        observed_at=stamp(raw["observedAt"]),
        vm=None if vm is None else azure_vm_of(vm.raw),
        finding=f.string("finding"),
        event_id=sys.intern(f.string("eventId")),
        azure_state=f.opt_string("azureState"),
        agent_vms=tuple(f.strings("agentVms")),
        grace_seconds=f.number("graceSeconds"),
        detail=text(raw["detail"], 500),
        signed_by=signed_by,
    )
