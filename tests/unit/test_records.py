"""Records read once, typed (issue 32): every record type has one reader that checks the type's
schema and returns a frozen value or a ``Refused`` (counted, logged), never a KeyError, a TypeError
or a half-read record. Each reader is fed its own type's valid record (from the real builders) and
then every way of breaking it a stream can carry: a field missing, of another type, an extra one, a
name or a list over its bound, not an object, not JSON, too large."""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from typing import Any

import orjson
import pytest
from azure_events import SUB, grid_event
from prometheus_client import CollectorRegistry, generate_latest

from bridge.azure.events import VmRef as AzureVm
from bridge.azure.events import from_event_grid
from bridge.azure.records import azure_event_record, finding_record
from bridge.azure.tracker import EventTracker
from bridge.imds.document import parse_document
from bridge.imds.instance import VmIdentity
from bridge.records import (
    approval_record,
    heartbeat_record,
    impact_record,
    preparation_record,
    scheduled_events_record,
)
from bridge.records.fields import MAX_NAME, MAX_RESOURCES, Refused
from bridge.records.reader import MAX_RECORD_BYTES, RECORD_TYPES, Reader
from bridge.signing import KeyRing, sign_record

RID = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm-a"
EVENT = "8D10DA13-8125-4BA9-A717-BF7490507B3D"
VM = VmIdentity(vm_id="0f8fad5b-d9cb-469f-a165-70867728950e", name="vm-a", resource_id=RID,
                private_ip="10.0.0.4")  # fmt: skip
RAW_DOCUMENT = {"DocumentIncarnation": 2, "Events": [{
    "EventId": EVENT, "EventType": "Freeze", "ResourceType": "VirtualMachine", "Resources": ["vm-a", "vm-b"],
    "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "Host update",
    "EventSource": "Platform", "DurationInSeconds": 9,
}]}  # fmt: skip


class _Change:
    def to_json(self) -> dict[str, Any]:
        return {"eventId": EVENT, "change": "scheduled", "eventType": "Freeze", "previousStatus": None,
                "eventStatus": "Scheduled"}  # fmt: skip


def valid_records() -> dict[str, dict[str, Any]]:
    """One record of every type, as the writers build them."""
    now = time.time()
    document = parse_document(orjson.dumps(RAW_DOCUMENT), api_version="2020-07-01")
    event = from_event_grid(grid_event(EVENT, "Scheduled", ["vm-a", "vm-b"]))
    news = EventTracker().observe(event)
    assert news is not None
    azure_vm = AzureVm(
        SUB,
        "rg",
        "vm-a",
        RID,
    )
    impact = {"eventType": "Freeze", "ending": "completed", "advertisedDurationSeconds": 9,
              "firstSeenAt": "2026-11-20T10:00:00Z", "approvedAt": None, "startedAt": "2026-11-20T10:15:00Z",
              "endedAt": "2026-11-20T10:15:09Z", "pauseSeconds": 8.5, "pauseClock": "monotonic",
              "gapsSeconds": {"monotonic": 8.5}, "rebooted": False, "downSeconds": None}  # fmt: skip
    return {
        "scheduledEvents": scheduled_events_record(VM, None, document, [_Change()], now),
        "heartbeat": heartbeat_record(VM, document, True, 60.0, now),
        "preparation": preparation_record(
            VM, document.events[0].to_json(), "prepared", {"result": "ok", "exitCode": 0, "seconds": 1.5}, now
        ),
        "approval": approval_record(
            "agent",
            decision_id="d-1",
            event_ids=[EVENT],
            outcome="approved",
            reason=None,
            results=[{"eventId": EVENT, "result": "approved"}],
            vm=VM,
            api_version="2020-07-01",
            start_requests_posted=1,
        ),
        "impact": impact_record(VM, EVENT, impact, now),
        "azureScheduledEvent": azure_event_record(event, news, now),
        "reconciliation": finding_record(
            "unwatched",
            EVENT,
            azure_vm,
            "no agent",
            now,
            grace_seconds=60,
            azure_state="Scheduled",
            agent_vms=[],
        ),
    }


VALID = valid_records()


@pytest.mark.parametrize("kind", sorted(VALID))
def test_each_reader_reads_its_own_types_record_into_a_frozen_slotted_value(kind: str) -> None:
    record = Reader().read(VALID[kind])
    assert record is not None and not isinstance(record, Refused)
    assert RECORD_TYPES[type(record)] == kind and record.record_id == VALID[kind]["recordId"]
    assert not hasattr(record, "__dict__")  # slotted: a fleet's worth of them stays small
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.record_id = "x"  # type: ignore[misc]


def _breakages(record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every required field removed, every field given a value of the wrong type, one field added,
    and the same one level down (the VM block, the first event, change, result and VM of Azure's)."""
    out = []
    for key in record:
        if key in ("schemaVersion", "recordType"):
            continue
        gone = copy.deepcopy(record)
        del gone[key]
        out.append((f"without {key}", gone))
        for wrong in (12345, "text", [], {"a": 1}, None, True):
            if type(wrong) is type(record[key]) or (wrong is None and record[key] is None):
                continue
            bent = copy.deepcopy(record)
            bent[key] = wrong
            out.append((f"{key}={wrong!r}", bent))
    out.append(("an extra field", {**copy.deepcopy(record), "planted": "x"}))
    for key in ("vm", "event", "events", "changes", "results", "vms", "hook"):
        block = record.get(key)
        inner = block[0] if isinstance(block, list) and block else block
        if not isinstance(inner, dict):
            continue
        for field in inner:
            bent = copy.deepcopy(record)
            target = bent[key][0] if isinstance(block, list) else bent[key]
            target[field] = {"not": "this"}
            out.append((f"{key}.{field} an object", bent))
    return out


@pytest.mark.parametrize("kind", sorted(VALID))
def test_a_record_that_breaks_its_schema_is_refused_and_counted_never_an_exception(kind: str) -> None:
    reader = Reader()
    refused = 0
    for what, broken in _breakages(VALID[kind]):
        result = reader.read(broken)  # must not raise, whatever the damage
        if isinstance(result, Refused):
            refused += 1
            assert result.record_type == kind and result.reason == "schema", what
            assert "planted" not in result.detail and "this" not in result.detail  # paths, not values
        else:  # a breakage the schema allows (a nullable field set to null): still a whole record
            assert result is not None and RECORD_TYPES[type(result)] == kind, what
    assert refused > 0
    assert reader.refused[(kind, "schema")] == refused


def test_names_and_lists_over_their_bounds_are_refused_as_too_large() -> None:
    reader = Reader()
    long_name = copy.deepcopy(VALID["heartbeat"])
    long_name["vm"]["name"] = "x" * (MAX_NAME + 1)
    many = copy.deepcopy(VALID["scheduledEvents"])
    many["events"][0]["resources"] = [f"vm-{i}" for i in range(MAX_RESOURCES + 1)]
    for record in (long_name, many):
        result = reader.read(record)
        assert isinstance(result, Refused) and result.reason == "tooLarge"
    assert (
        reader.refused[("heartbeat", "tooLarge")] == 1
        and reader.refused[("scheduledEvents", "tooLarge")] == 1
    )


def test_an_identifier_a_decision_is_taken_on_is_refused_when_too_long_never_cut() -> None:
    """A vmId pins a VM, a resource id or an event's parent chooses an ARM scope: cut to a bound, a
    hostile one could stand for another; so it is refused (tooLarge), counted."""
    reader = Reader(azure_keys=KeyRing({"azure": b"k" * 40}))
    long_vm_id = copy.deepcopy(VALID["scheduledEvents"])
    long_vm_id["vm"]["vmId"] = "0" * (MAX_NAME + 1)
    long_resource = copy.deepcopy(VALID["heartbeat"])
    long_resource["vm"]["resourceId"] = RID + "/x" * 600
    long_parent = copy.deepcopy(VALID["azureScheduledEvent"])
    long_parent["event"]["parentId"] = RID + "/x" * 600
    for record in (long_vm_id, long_resource, sign_record("azure", b"k" * 40, long_parent)):
        result = reader.read(record)
        assert isinstance(result, Refused) and result.reason == "tooLarge", result


def test_what_is_no_record_is_refused_by_kind_and_other_types_are_left_alone() -> None:
    reader = Reader(types=("scheduledEvents",))
    assert isinstance(reader.read([1, 2]), Refused)
    assert isinstance(reader.read({"recordType": "invented"}), Refused)
    assert isinstance(reader.read({"recordId": "no type"}), Refused)
    assert isinstance(reader.read_bytes(b"{not json"), Refused)
    assert isinstance(reader.read_bytes(b" " * (MAX_RECORD_BYTES + 1)), Refused)
    assert reader.read(VALID["heartbeat"]) is None  # a type this consumer does not want: not checked
    assert reader.refused[("unknown", "notObject")] == 2
    assert reader.refused[("unknown", "unknownType")] == 2
    assert reader.refused[("unknown", "tooLarge")] == 1


def test_signatures_are_verified_where_records_are_read_once() -> None:
    key = b"k" * 40
    reader = Reader(azure_keys=KeyRing({"azure": key}), approver_keys=KeyRing({"approvers": key}))
    for kind in ("azureScheduledEvent", "reconciliation"):
        signed = sign_record("azure", key, VALID[kind])
        assert reader.read(signed).signed_by == "azure"  # type: ignore[union-attr]
        assert reader.read(VALID[kind]).signed_by is None  # type: ignore[union-attr]
        tampered = {**signed, "late": True} if kind == "azureScheduledEvent" else {**signed, "detail": "lie"}
        assert reader.read(tampered).signed_by is None  # type: ignore[union-attr]
    audit = {**VALID["approval"], "component": "approver", "vm": None}
    assert reader.read(sign_record("approvers", key, audit)).signed_by == "approvers"  # type: ignore[union-attr]
    agents = sign_record("approvers", key, VALID["approval"])  # an agent's record is never an approver's
    assert reader.read(agents).signed_by is None  # type: ignore[union-attr]


def test_refusals_are_a_metric_with_bounded_labels() -> None:
    reader = Reader()
    for n in range(50):
        reader.read({"recordType": f"invented-{n}"})
    registry = CollectorRegistry()
    registry.register(reader)
    text = generate_latest(registry).decode()
    assert 'se_bridge_records_refused_total{reason="unknownType",recordType="unknown"} 50.0' in text
    assert "invented" not in text


def test_a_hostile_stream_costs_one_log_line_a_minute_per_type_and_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Counted always, logged once a minute per (type, reason) with how many were refused since."""
    import bridge.records.reader as reader_module

    clock = [1000.0]
    monkeypatch.setattr(reader_module.time, "monotonic", lambda: clock[0])
    reader = Reader()

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == "record refused"]

    with caplog.at_level(logging.WARNING, logger="bridge.records.reader"):
        for _ in range(1000):
            reader.read({"recordType": "invented"})
        reader.read(b"not json")
        assert [(r.reason, r.refusedSinceLastLine) for r in lines()] == [  # type: ignore[attr-defined]
            ("unknownType", 0),
            (lines()[1].reason, 0),  # type: ignore[attr-defined]
        ]
        clock[0] += reader_module.LOG_EVERY - 1
        reader.read({"recordType": "invented"})
        assert len(lines()) == 2
        clock[0] += 1
        reader.read({"recordType": "invented"})
    assert len(lines()) == 3 and lines()[2].refusedSinceLastLine == 1000  # type: ignore[attr-defined]
    assert sum(reader.refused.values()) == 1003


def test_a_heartbeat_restates_the_open_events_in_short() -> None:
    """Issue 34: Azure announces some events days ahead (up to 7), an Azure Monitor alert looks back at
    most 2 days, and scheduledEvents records come only with changes: every heartbeat restates the
    open events (no resources: a whole availability set's Freeze names every VM), at most 100."""
    document = parse_document(orjson.dumps(RAW_DOCUMENT), api_version="2020-07-01")
    beat = heartbeat_record(VM, document, True, 300.0, time.time())
    assert beat["events"] == [{"eventId": EVENT, "eventType": "Freeze", "eventStatus": "Scheduled",
                               "notBefore": "2016-09-19T18:29:47Z", "affectsThisVm": True}]  # fmt: skip
    assert not isinstance(Reader().read(beat), Refused)
    many = {
        **RAW_DOCUMENT,
        "Events": [{**RAW_DOCUMENT["Events"][0], "EventId": f"E-{n}"} for n in range(150)],
    }
    crowded = heartbeat_record(VM, parse_document(orjson.dumps(many), api_version="2020-07-01"), True, 300.0,
                               time.time())  # fmt: skip
    assert len(crowded["events"]) == 100 and crowded["openEvents"] == 150
    assert not isinstance(Reader().read(crowded), Refused)
    assert heartbeat_record(VM, None, False, 300.0, time.time())["events"] == []
