"""Transition classification, record ids and the record schema."""

from __future__ import annotations

import pytest
from helpers import VM, doc, event

from bridge.agent.diff import diff, is_change
from bridge.imds.instance import VmIdentity, identity_from_instance
from bridge.records import record_id
from bridge.records import scheduled_events_record as build_record
from bridge.schemas import validate_record


def kinds(previous, current) -> list[tuple[str, str]]:
    return [(c.event_id, c.change) for c in diff(previous, current)]


def test_first_observation_reports_present_events() -> None:
    assert kinds(None, doc(7, event("a"), event("b", "Started"))) == [("a", "present"), ("b", "present")]
    assert kinds(None, doc(1)) == []


def test_documented_live_migration_flow() -> None:
    d1, d2, d3, d4 = doc(1), doc(2, event("a")), doc(3, event("a", "Started")), doc(4)
    assert kinds(d1, d2) == [("a", "scheduled")]
    assert kinds(d2, d3) == [("a", "started")]
    assert kinds(d3, d4) == [("a", "completed")]


def test_canceled_hardware_failure_updated_and_overlapping() -> None:
    assert [c.change for c in diff(doc(2, event("a")), doc(3), observed_at=0)] == ["canceled"]
    assert kinds(doc(1), doc(2, event("hw", "Started", "Reboot"))) == [("hw", "startedWithoutNotice")]
    moved = doc(3, event("a", not_before="Mon, 11 Apr 2022 23:00:00 GMT"))
    assert kinds(doc(2, event("a")), moved) == [("a", "updated")]
    both = doc(5, event("a", "Started"), event("b", etype="Reboot"))
    assert kinds(doc(4, event("a")), both) == [("a", "started"), ("b", "scheduled")]


def test_scheduled_event_gone_while_watched_is_canceled_after_a_gap_it_may_have_started() -> None:
    # NotBefore 2022-04-11T22:26:58Z (helpers.event).
    (change,) = diff(doc(2, event("a")), doc(3), observed_at=1_700_000_000)
    assert change.change == "canceled"  # watched continuously: it really vanished while Scheduled
    (change,) = diff(doc(2, event("a")), doc(3), observed_at=1_700_000_000, continuous=False)
    assert (change.change, change.previous_status) == ("completed", "Scheduled")  # started unseen
    (change,) = diff(doc(2, event("a")), doc(3), observed_at=1_600_000_000, continuous=False)
    assert change.change == "canceled"  # before its NotBefore: withdrawn
    (change,) = diff(doc(2, event("a", not_before="")), doc(3), observed_at=1_700_000_000, continuous=False)
    assert change.change == "canceled"  # no time known


def test_a_scheduled_event_this_vm_approved_that_vanishes_is_completed_not_canceled() -> None:
    """Issue 21: approval starts an event; when the agent misses its Started state (it stopped right
    after the StartRequest, or an accelerated emulator), the event still happened."""
    approved = {"a"}.__contains__
    for continuous, when in ((True, 1_600_000_000), (False, 1_600_000_000), (False, 1_700_000_000)):
        changes = diff(doc(2, event("a"), event("b")), doc(3), when, continuous=continuous, approved=approved)
        assert [(c.event_id, c.change, c.previous_status) for c in changes] == [
            ("a", "completed", "Scheduled"),
            ("b", "canceled" if continuous or when < 1_650_000_000 else "completed", "Scheduled"),
        ]


def test_undocumented_statuses_are_reported_not_invented() -> None:
    assert kinds(doc(1), doc(2, event("x", "Paused"))) == [("x", "appeared")]
    assert kinds(doc(2, event("x", "Paused")), doc(3)) == [("x", "removed")]
    assert kinds(doc(2, event("x", "Started")), doc(3, event("x", "Scheduled"))) == [("x", "statusChanged")]


def test_gone_event_change_carries_previous_status_and_null_status() -> None:
    (change,) = diff(doc(3, event("a", "Started", "Reboot")), doc(4))
    assert change.to_json() == {
        "eventId": "a",
        "change": "completed",
        "eventType": "Reboot",
        "previousStatus": "Started",
        "eventStatus": None,
    }


def test_change_detection_covers_backwards_and_repeated_incarnations() -> None:
    base = doc(5, event("a"))
    assert not is_change(base, doc(5, event("a")))
    assert is_change(base, doc(4, event("a")))  # incarnation went backwards
    assert is_change(base, doc(5, event("a", "Started")))  # same incarnation, new content
    assert is_change(base, doc(6, event("a")))  # new incarnation, same content
    assert is_change(None, doc(1))


def test_record_id_is_deterministic_and_change_specific() -> None:
    d1, d2 = doc(1), doc(2, event("a"))
    assert record_id(VM.key, d1, d2) == record_id(VM.key, doc(1), doc(2, event("a")))
    assert record_id(VM.key, d1, d2) != record_id(VM.key, None, d2)
    assert record_id(VM.key, d1, d2) != record_id("other-vm", d1, d2)
    assert record_id(VM.key, d1, d2) != record_id(VM.key, d1, doc(2, event("b")))


def test_record_is_schema_valid_and_complete() -> None:
    prev, cur = doc(2, event("a")), doc(3, event("a", "Started"), event("b", resources=["other-vm"]))
    record = build_record(VM, prev, cur, diff(prev, cur), 1_790_000_000.25)
    assert validate_record(record) == []
    assert record["observedAt"] == "2026-09-21T14:13:20.250Z"
    assert record["previousIncarnation"] == 2 and record["documentIncarnation"] == 3
    assert [e["affectsThisVm"] for e in record["events"]] == [True, False]
    assert record["raw"] == cur.raw
    assert record["vm"]["vmId"] == VM.vm_id


def test_schema_rejects_what_it_should() -> None:
    cur = doc(1, event("a"))
    record = build_record(VM, None, cur, diff(None, cur), 0)
    assert validate_record({**record, "recordId": "not-a-uuid"})
    assert validate_record(
        {
            **record,
            "changes": [
                {
                    "eventId": "a",
                    "change": "exploded",
                    "eventType": "Freeze",
                    "previousStatus": None,
                    "eventStatus": None,
                }
            ],
        }
    )
    assert validate_record({**record, "extra": 1})
    assert validate_record({**record, "recordType": "nope"})


@pytest.mark.parametrize(
    ("compute", "resources", "affected"),
    [
        ({"name": "vm-a"}, ["VM-A"], True),  # Azure names are case-insensitive
        ({"name": "vm-a"}, ["vm-b"], False),
        (
            {
                "name": "webvmss_3",
                "vmScaleSetName": "webvmss",
                "osProfile": {"computerName": "webvmss000003"},
                "resourceId": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/"
                "virtualMachineScaleSets/webvmss/virtualMachines/3",
            },
            ["webvmss_3"],
            True,
        ),
        (
            {
                "name": "webvmss_3",
                "vmScaleSetName": "webvmss",
                "osProfile": {"computerName": "webvmss000003"},
            },
            ["webvmss000003"],
            False,
        ),  # the computer name never appears in Resources
        (
            {
                "name": "odd-name",
                "resourceId": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/"
                "virtualMachineScaleSets/pool/virtualMachines/12",
            },
            ["pool_12"],
            True,
        ),
    ],
)
def test_affects_this_vm(compute: dict, resources: list[str], affected: bool) -> None:
    identity = identity_from_instance({"compute": compute})
    assert identity.affects(resources) is affected


def test_identity_round_trips_through_the_state_cache() -> None:
    again = VmIdentity.from_state(VM.to_state())
    assert again.to_record() == VM.to_record() and again.source == "cache"


def test_the_transitions_are_the_record_schemas() -> None:
    """One list of words (issue 24): the type the diff returns and the schema's enum agree."""
    from typing import get_args

    from bridge.agent.diff import Transition
    from bridge.schemas import load_schema

    schema = load_schema("record.v1.schema.json")
    assert list(get_args(Transition)) == schema["$defs"]["change"]["properties"]["change"]["enum"]
