"""Event Grid events of the MaintenanceResources system topic, as tests build them: the shape on
Microsoft's page ("Scheduled Events with Event Grid": dataVersion "3.0", subject the event's id) and
the shape real captures show (dataVersion "1", data.apiVersion "2020-03-01", subject the VM's id)."""

from __future__ import annotations

import uuid
from typing import Any

SUB = "0f8fad5b-d9cb-469f-a165-70867728950e"
RG = "rg-fleet"
TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"


def parent_id(parent: str, kind: str = "virtualMachines", sub: str = SUB, rg: str = RG) -> str:
    return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/{kind}/{parent}"


def grid_event(
    event_id: str,
    status: str,
    resources: list[str],
    *,
    parent: str | None = None,
    kind: str = "virtualMachines",
    shape: str = "microsoft",
    delivery_id: str | None = None,
    event_type: str = "Reboot",
    resource_type: str = "VirtualMachine",
    not_before: str = "Mon, 30 Nov 2026 10:00:00 GMT",
    sub: str = SUB,
    rg: str = RG,
    **extra_properties: Any,
) -> dict[str, Any]:
    parent = parent or resources[0]
    where = parent_id(parent, kind, sub, rg)
    event_arm_id = f"{where}/providers/microsoft.maintenance/scheduledevents/{event_id}"
    properties = {
        "EventId": event_id,
        "EventType": event_type,
        "EventStatus": status,
        "EventSource": "Platform",
        "NotBefore": not_before if status == "Scheduled" else "",
        "Description": "Host server is undergoing maintenance.",
        "DurationInSeconds": 7 if event_type == "Freeze" else -1,
        "Resources": resources,
        "ResourceType": resource_type,
        **extra_properties,
    }
    envelope: dict[str, Any] = {
        "id": delivery_id or str(uuid.uuid4()),
        "topic": f"/subscriptions/{sub}",
        "subject": event_arm_id if shape == "microsoft" else where,
        "eventType": TYPE,
        "eventTime": "2026-11-25T10:00:00.0000000Z",
        "dataVersion": "3.0" if shape == "microsoft" else "1",
        "metadataVersion": "1",
        "data": {
            "resourceInfo": {
                "id": event_arm_id,
                "name": event_id,
                "type": "microsoft.maintenance/scheduledevents",
                "location": "westeurope",
                "properties": properties,
            },
            "apiVersion": "2024-07-01" if shape == "microsoft" else "2020-03-01",
        },
    }
    if shape == "microsoft":
        envelope["data"]["operationalInfo"] = {"resourceEventTime": "2026-11-25T09:59:58.1234567Z"}
    return envelope
