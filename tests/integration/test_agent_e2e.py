"""The agent as a real process against the emulator: scenarios, records, the HTTP API, SIGTERM."""

from __future__ import annotations

import itertools

import orjson
import pytest
from procs import Emulator, wait_until

from bridge.schemas import validate_record

# Each scenario played at 300x (a 15-minute notice lasts 3 s) and the transitions it must produce.
# Spot eviction (30 s notice, 1 min Started) and Terminate (1 min Started) play slower, so every state
# lasts several of the agent's 0.2 s polls.
SPEED = {"spot-eviction": 20, "terminate": 100}
SCENARIOS = {
    "live-migration": ["scheduled", "started", "completed"],
    "user-reboot": ["scheduled", "started", "completed"],
    "host-agent-maintenance": ["scheduled", "started", "completed"],
    "redeploy": ["scheduled", "started", "completed"],
    "user-redeploy": ["scheduled", "started", "completed"],
    "canceled-maintenance": ["scheduled", "canceled"],
    "spot-eviction": ["scheduled", "started", "completed"],
    "terminate": ["scheduled", "started", "completed"],
    "hardware-failure": ["startedWithoutNotice", "completed"],
    "multi-vm": ["scheduled", "started", "completed"],
    "overlapping": ["scheduled", "scheduled", "started", "started", "completed", "completed"],
}


def assert_consistent(records: list[dict]) -> None:
    """Every record valid; a record seen twice (at-least-once: the agent died between delivering it
    and saving its cursor) is the same record under the same id; no change under two ids; and each
    record diffs against the one before it."""
    for record in records:
        assert validate_record(record) == [], record
    unique: dict[str, dict] = {}
    for record in records:
        assert unique.setdefault(record["recordId"], record) == record, "one id, two different records"
    records = list(unique.values())
    changes = [(r["previousIncarnation"], r["documentIncarnation"], str(r["changes"])) for r in records]
    assert len(changes) == len(set(changes)), "a change was reported twice under different ids"
    assert records[0]["previousIncarnation"] is None
    for before, after in itertools.pairwise(records):
        assert after["previousIncarnation"] == before["documentIncarnation"]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_scenario_produces_its_transitions(scenario: str, make_agent) -> None:
    args = ["--rate-limit", "0"]
    if scenario == "terminate":
        args += ["--vmss-name", "webvmss", "--instance-id", "3"]
    emu = Emulator(*args)
    try:
        agent = make_agent(emu.url).start()  # records the empty document, before the scenario
        emu.control("POST", "scenario", {"name": scenario, "speed": SPEED.get(scenario, 300)})
        wait_until(
            lambda: emu.state()["pendingSteps"] == 0 and not emu.state()["events"], 30, what="scenario end"
        )
        expected = SCENARIOS[scenario]
        wait_until(
            lambda: sorted(c for _, c in agent.changes()) == sorted(expected),
            10,
            what=f"transitions {expected}, got {agent.changes()}",
        )
        records = agent.records()
        assert_consistent(records)
        assert records[0]["changes"] == [] and records[0]["events"] == []  # first observation, empty document
        assert records[-1]["events"] == []
        events = [e for r in records for e in r["events"]]
        assert all(e["affectsThisVm"] for e in events)
        if scenario == "multi-vm":
            assert all(len(e["resources"]) > 1 for e in events)
        if scenario == "terminate":
            assert {e["eventType"] for e in events} == {"Terminate"}
            assert records[0]["vm"]["vmScaleSetName"] == "webvmss" and records[0]["vm"]["name"] == "webvmss_3"
        for e in events:
            assert (e["notBefore"] is None) == (e["eventStatus"] == "Started")
        assert agent.terminate() == 0
    finally:
        emu.stop()


def test_documented_flow_record_by_record(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(
        eventType="Freeze", noticeSeconds=900, durationInSeconds=5, eventSource="Platform"
    )
    scheduled = agent.wait_for_change(eid, "scheduled")
    (event,) = scheduled["events"]
    assert event["eventStatus"] == "Scheduled" and event["notBefore"].endswith("Z")
    assert event["durationInSeconds"] == 5 and event["eventSource"] == "Platform"
    assert scheduled["raw"]["Events"][0]["NotBefore"].endswith("GMT")  # RFC 1123 as IMDS sent it
    emulator.control("POST", f"events/{eid}/reschedule", {"noticeSeconds": 1200})
    updated = agent.wait_for_change(eid, "updated")
    assert updated["events"][0]["notBefore"] > event["notBefore"]
    emulator.control("POST", f"events/{eid}/start")
    started = agent.wait_for_change(eid, "started")
    assert started["changes"] == [
        {
            "eventId": eid,
            "change": "started",
            "eventType": "Freeze",
            "previousStatus": "Scheduled",
            "eventStatus": "Started",
        }
    ]
    emulator.control("POST", f"events/{eid}/complete")
    completed = agent.wait_for_change(eid, "completed")
    assert completed["changes"][0]["eventStatus"] is None
    assert_consistent(agent.records())


def test_http_api_health_ready_metrics_document(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url).start()
    wait_until(lambda: agent.get("/readyz").status_code == 200, what="ready")
    assert agent.get("/healthz").json() == {"status": "ok"}
    eid = emulator.add_event(eventType="Reboot", eventSource="User")
    agent.wait_for_change(eid, "scheduled")
    wait_until(lambda: agent.get("/v1/document").json()["events"], what="document")
    document = agent.get("/v1/document").json()
    assert document["events"][0]["eventId"] == eid and document["events"][0]["affectsThisVm"] is True
    metrics = agent.get("/metrics").text
    assert eid not in metrics and eid.lower() not in metrics  # never an event id in a label
    assert agent.metric("se_bridge_changes_total", change="scheduled", type="Reboot") == 1
    assert agent.metric("se_bridge_records_total") == 2
    wait_until(lambda: agent.metric("se_bridge_sink_sent_total") == 2, what="sink confirmations")
    assert agent.metric("se_bridge_outbox_records") == 0
    assert agent.get("/nope").status_code == 404


def test_sigterm_delivers_and_exits_zero(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    assert agent.terminate() == 0
    assert any(e.get("msg") == "agent stopped" for e in agent.logs())
    assert not [e for e in agent.logs() if e.get("level") in ("error", "raw")]


def test_old_api_version_is_normalized_end_to_end(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url, "--api-version", "2017-03-01").start()
    eid = emulator.add_event(eventType="Reboot", noticeSeconds=600)
    record = agent.wait_for_change(eid, "scheduled")
    event = record["events"][0]
    assert record["raw"]["Events"][0]["Resources"] == ["_vm-bridge-0"]
    assert event["resources"] == ["vm-bridge-0"] and event["affectsThisVm"] is True
    assert record["raw"]["Events"][0]["NotBefore"].endswith("Z")  # ISO 8601 in 2017-03-01
    assert (event["description"], event["eventSource"], event["durationInSeconds"]) == (None, None, None)
    assert validate_record(record) == []


def test_imds_requests_bypass_proxies(emulator: Emulator, make_agent) -> None:
    # A proxy that does not exist: any request routed through it would fail.
    env = {"HTTP_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "NO_PROXY": ""}
    agent = make_agent(emulator.url, env=env).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    assert agent.metric("se_bridge_imds_poll_errors_total") == 0


def test_unknown_event_type_and_status_are_forwarded(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url).start()
    doc = (
        '{"DocumentIncarnation": 9, "Events": [{"EventId": "x-1", "EventType": "Hibernate", '
        '"EventStatus": "Pending", "ResourceType": "VirtualMachine", "Resources": ["vm-bridge-0"], '
        '"NotBefore": ""}]}'
    )
    emulator.control("PUT", "raw", {"body": doc})
    record = agent.wait_for_change("x-1", "appeared")
    assert record["events"][0]["eventType"] == "Hibernate" and record["events"][0]["eventStatus"] == "Pending"
    assert validate_record(record) == []
    assert agent.metric("se_bridge_events", type="other", status="other") == 1


def test_one_bad_element_neither_hides_the_other_events_nor_ends_its_own(
    emulator: Emulator, make_agent
) -> None:
    """Issue 23: one unreadable element of Events hid every event while it lasted. Now the good ones
    are recorded, the bad one is counted and logged, and an event whose element goes bad for a
    moment is not reported gone (then back as new)."""
    agent = make_agent(emulator.url).start()

    def event(event_id: str, **more: object) -> dict[str, object]:
        return {"EventId": event_id, "EventType": "Freeze", "EventStatus": "Scheduled", "ResourceType":
                "VirtualMachine", "Resources": ["vm-bridge-0"], "NotBefore": "", **more}  # fmt: skip

    def serve(incarnation: int, *events: object) -> None:
        emulator.control("PUT", "raw", {"body": orjson.dumps(
            {"DocumentIncarnation": incarnation, "Events": list(events)}).decode()})  # fmt: skip

    serve(10, event("good-1"), event("bad-1", Resources="vm-bridge-0"))
    agent.wait_for_change("good-1", "scheduled")
    serve(11, event("good-1"), event("bad-1"))  # repaired: a new event, recorded
    agent.wait_for_change("bad-1", "scheduled")
    serve(12, event("good-1", Resources=7), event("bad-1", EventStatus="Started"))  # good-1 goes bad
    agent.wait_for_change("bad-1", "started")
    serve(13, event("good-1"))
    wait_until(lambda: agent.records()[-1]["documentIncarnation"] == 13, what="the repaired document")
    assert [c for c in agent.changes() if c[0] == "good-1"] == [("good-1", "scheduled")]  # never gone
    assert agent.metric("se_bridge_document_errors_total", reason="bad_event") >= 2
    assert_consistent(agent.records())


def test_incarnation_going_backwards_or_repeating_with_new_content_is_a_change(
    emulator: Emulator, make_agent
) -> None:
    agent = make_agent(emulator.url).start()

    def serve(incarnation: int, status: str) -> None:
        body = (
            f'{{"DocumentIncarnation": {incarnation}, "Events": [{{"EventId": "e-1", "EventType": "Freeze", '
            f'"EventStatus": "{status}", "ResourceType": "VirtualMachine", "Resources": ["vm-bridge-0"], '
            '"NotBefore": ""}]}'
        )
        emulator.control("PUT", "raw", {"body": body})

    serve(50, "Scheduled")
    agent.wait_for_change("e-1", "scheduled")
    serve(50, "Started")  # same incarnation, new content
    agent.wait_for_change("e-1", "started")
    serve(3, "Started")  # incarnation went backwards, same content
    wait_until(lambda: agent.records()[-1]["documentIncarnation"] == 3, what="backwards incarnation record")
    assert agent.records()[-1]["changes"] == []
    assert_consistent(agent.records())


def test_two_sinks_file_and_stdout_get_the_same_records_in_order(emulator: Emulator, tmp_path) -> None:
    import subprocess
    import sys

    import orjson

    sink_file = tmp_path / "both.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bridge",
            "agent",
            "--imds-url",
            emulator.url,
            "--sink",
            "stdout:",
            "--sink",
            f"file://{sink_file}",
            "--state-dir",
            str(tmp_path / "state"),
            "--poll-interval",
            "0.2",
            "--listen",
            "off",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: sink_file.exists() and sink_file.read_bytes(), what="first record")
        eid = emulator.add_event(eventType="Freeze")
        wait_until(lambda: b'"scheduled"' in sink_file.read_bytes(), what="scheduled record in the file")
        emulator.control("POST", f"events/{eid}/cancel")
        wait_until(lambda: b'"canceled"' in sink_file.read_bytes(), what="canceled record in the file")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0

    def documents(lines: list[bytes]) -> list[str]:  # the impact record may still be on its way
        return [r["recordId"] for r in map(orjson.loads, lines) if r["recordType"] == "scheduledEvents"]

    from_stdout = documents(out.splitlines())
    from_file = documents(sink_file.read_bytes().splitlines())
    assert from_stdout == from_file and len(from_file) == 3


def test_heartbeats_tell_a_quiet_vm_from_a_dead_agent(emulator: Emulator, make_agent) -> None:
    """Records come only with changes: a VM with no maintenance is silent for weeks. A heartbeat
    every --heartbeat-interval (here 1 s) says the agent is alive and watching; its id is derived
    from the VM and the interval, so a resend is the same record."""
    agent = make_agent(emulator.url, "--heartbeat-interval", "1").start()
    beats = wait_until(lambda: b if len(b := agent.records("heartbeat")) >= 2 else None, 15, what="two beats")
    assert all(validate_record(b) == [] for b in beats)
    assert len({b["recordId"] for b in beats}) == len(beats)
    first = beats[0]
    assert (first["intervalSeconds"], first["imdsOk"], first["openEvents"]) == (1.0, True, 0)
    assert first["vm"]["name"] == "vm-bridge-0" and isinstance(first["documentIncarnation"], int)
