"""The records Azure's channel and its reconciliation publish (``schemas/azure-event.v1.schema.json``,
``schemas/reconciliation.v1.schema.json``), beside the agents' records on the same sinks.

``source.kind`` tells them apart from an agent's: ``azure`` here (with the channel that carried the
event), where an agent's records carry ``agentVersion`` and no kind. Both ids are deterministic: the
same observation from Event Grid and from Resource Graph, or delivered twice, is one ``recordId``;
a finding is one ``recordId`` per event, VM and kind.
"""

from __future__ import annotations

from typing import Literal

from bridge import __version__
from bridge.azure.events import AzureEvent, VmRef
from bridge.azure.tracker import News
from bridge.records import SCHEMA_VERSION, derived_id
from bridge.schemas import JsonObject, json_list
from bridge.support.timeutil import rfc3339

AZURE_EVENT = "azureScheduledEvent"
RECONCILIATION = "reconciliation"
Finding = Literal["unwatched", "outcome", "agentOnly"]


def azure_event_record(event: AzureEvent, news: News, observed_at: float) -> JsonObject:
    return {
        "schemaVersion": SCHEMA_VERSION,
        "recordType": AZURE_EVENT,
        "recordId": derived_id("azure", *map(str, event.content)),
        "observedAt": rfc3339(observed_at),
        "source": {
            "kind": "azure",
            "channel": event.channel,
            "bridgeVersion": __version__,
            "apiVersion": event.api_version,
            "deliveryId": event.delivery_id,
            "eventTime": event.event_time,
        },
        "event": {
            "eventId": event.event_id,
            "eventType": event.event_type,
            "eventStatus": event.event_status,
            "eventSource": event.event_source,
            "notBefore": event.not_before,
            "description": event.description,
            "durationInSeconds": event.duration_in_seconds,
            "resources": list(event.resources),
            "resourceId": event.resource_id,
            "parentId": event.parent_id,
            "location": event.location,
        },
        "vms": [_vm(vm) for vm in event.vms()],
        "state": news.state,
        "late": news.late,
        "unknown": event.unknown or None,
    }


def finding_record(
    finding: Finding,
    event_id: str,
    vm: VmRef | None,
    detail: str,
    observed_at: float,
    *,
    grace_seconds: float,
    azure_state: str | None,
    agent_vms: list[str],
) -> JsonObject:
    key = ("reconciliation", finding, event_id.lower(), vm.key if vm else "", azure_state or "")
    return {
        "schemaVersion": SCHEMA_VERSION,
        "recordType": RECONCILIATION,
        "recordId": derived_id(*key),
        "observedAt": rfc3339(observed_at),
        "source": {"kind": "reconciliation", "bridgeVersion": __version__},
        "finding": finding,
        "eventId": event_id,
        "vm": _vm(vm) if vm else None,
        "azureState": azure_state,
        "agentVms": json_list(agent_vms),
        "graceSeconds": grace_seconds,
        "detail": detail,
    }


def _vm(vm: VmRef) -> JsonObject:
    return {
        "name": vm.name,
        "resourceId": vm.resource_id,
        "subscriptionId": vm.subscription_id,
        "resourceGroup": vm.resource_group,
    }
