"""Valid records for tests, and the typed values the services read from them.

Services read records through :class:`bridge.records.reader.Reader` (schema checked, typed), so a
test feeds them what an agent would publish: every field its schema requires. The helpers fill what a
test does not care about; ``typed`` reads a record as a service would and fails the test on a refusal
(a fixture that breaks the schema is a broken test, not a case)."""

from __future__ import annotations

import uuid
from typing import Any

from bridge.records.fields import Refused
from bridge.records.reader import Reader, Record

AT = "2026-11-20T10:00:00Z"


def vm_block(
    name: str,
    *,
    vm_id: str | None = None,
    resource_id: str | None = None,
    private_ip: str | None = None,
    subscription_id: str | None = None,
    resource_group: str | None = None,
    location: str | None = None,
    zone: str | None = None,
    scale_set: str | None = None,
) -> dict[str, Any]:
    return {
        "vmId": vm_id, "name": name, "resourceId": resource_id, "subscriptionId": subscription_id,
        "resourceGroup": resource_group, "location": location, "zone": zone, "vmScaleSetName": scale_set,
        "privateIp": private_ip, "hostname": None,
    }  # fmt: skip


def event(
    event_id: str,
    *resources: str,
    event_type: str = "Freeze",
    status: str = "Scheduled",
    not_before: str | None = None,
    description: str | None = None,
    source: str | None = "Platform",
    duration: int | None = None,
    affects: bool = True,
) -> dict[str, Any]:
    return {
        "eventId": event_id, "eventType": event_type, "eventStatus": status, "resourceType": "VirtualMachine",
        "resources": list(resources), "notBefore": not_before, "description": description,
        "eventSource": source, "durationInSeconds": duration, "affectsThisVm": affects,
    }  # fmt: skip


def change(
    event_id: str,
    what: str,
    *,
    event_type: str = "Freeze",
    previous: str | None = None,
    status: str | None = None,
) -> dict[str, Any]:
    return {"eventId": event_id, "change": what, "eventType": event_type, "previousStatus": previous,
            "eventStatus": status}  # fmt: skip


def envelope(kind: str, at: str = AT, record_id: str | None = None) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "recordType": kind,
        "recordId": record_id or str(uuid.uuid4()),
        "observedAt": at,
        "source": {"agentVersion": "0.1.0", "apiVersion": "2020-07-01"},
    }


def scheduled_events(
    vm: dict[str, Any],
    events: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
    changes: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
    *,
    at: str = AT,
    incarnation: int = 1,
) -> dict[str, Any]:
    return {
        **envelope("scheduledEvents", at),
        "vm": vm,
        "documentIncarnation": incarnation,
        "previousIncarnation": None,
        "events": list(events),
        "changes": list(changes),
        "raw": {},
    }


def heartbeat(vm: dict[str, Any], *, at: str = AT, interval: float = 60.0) -> dict[str, Any]:
    record = {**envelope("heartbeat", at), "vm": vm, "intervalSeconds": interval, "documentIncarnation": 1,
              "openEvents": 0, "imdsOk": True}  # fmt: skip
    record["source"] = {"agentVersion": "0.1.0"}
    return record


def preparation(
    vm: dict[str, Any],
    event_id: str,
    result: str = "prepared",
    *,
    at: str = AT,
    resources: tuple[str, ...] = (),
) -> dict[str, Any]:
    record = {**envelope("preparation", at), "vm": vm, "eventId": event_id, "eventType": "Freeze",
              "notBefore": None, "resources": list(resources), "result": result, "hook": None}  # fmt: skip
    record["source"] = {"agentVersion": "0.1.0"}
    return record


def approval(
    *,
    component: str = "approver",
    decision_id: str | None = "d-1",
    event_ids: list[str] | tuple[str, ...] = (),
    outcome: str = "approved",
    at: str = AT,
    vm: dict[str, Any] | None = None,
    **more: Any,
) -> dict[str, Any]:
    record = {**envelope("approval", at), "component": component, "vm": vm, "decisionId": decision_id,
              "eventIds": list(event_ids), "outcome": outcome, "results": [], **more}  # fmt: skip
    record["source"] = {"agentVersion": "0.1.0"}
    return record


def typed(raw: dict[str, Any], reader: Reader | None = None) -> Record:
    """``raw`` as a service reads it; a refusal fails the test (the fixture breaks the schema)."""
    record = (reader or Reader()).read(raw)
    assert record is not None and not isinstance(record, Refused), f"fixture refused: {record}"
    return record
