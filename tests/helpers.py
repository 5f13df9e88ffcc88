"""Small builders shared by the unit tests (documents as IMDS would send them)."""

from __future__ import annotations

from typing import Any

import orjson

from bridge.imds.document import EventsDocument, parse_document
from bridge.imds.instance import VmIdentity

VM = VmIdentity(
    vm_id="02aab8a4-74ef-476e-8182-f6d2ba4166a6",
    name="vm-bridge-0",
    resource_id="/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/rg/providers/"
    "Microsoft.Compute/virtualMachines/vm-bridge-0",
    subscription_id="8d10da13-8125-4ba9-a717-bf7490507b3d",
    resource_group="rg",
    location="westeurope",
    zone="1",
    vm_scale_set_name=None,
    private_ip="10.0.0.4",
    hostname="vm-bridge-0",
)


def event(event_id: str, status: str = "Scheduled", etype: str = "Freeze", **extra: Any) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": etype,
        "ResourceType": "VirtualMachine",
        "Resources": extra.pop("resources", ["vm-bridge-0"]),
        "NotBefore": "" if status == "Started" else extra.pop("not_before", "Mon, 11 Apr 2022 22:26:58 GMT"),
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": 9,
        **extra,
    }


def doc(incarnation: int, *events: dict[str, Any]) -> EventsDocument:
    return parse_document(orjson.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}))
