"""Tests of the IMDS Scheduled Events emulator, over real HTTP on loopback (no mocks).

The emulator is the oracle the agent's client is tested against, so these tests pin its wire behaviour:
exact error answers, every api-version's shape, keep-alive, the event state machine driven through the
control API's ``advance`` (no long sleeps), faults, the raw override and the command line.
"""

import calendar
import contextlib
import email.utils
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import wait_until

from bridge.imds.emulator import SCENARIOS, SCHEDULED_EVENTS_VERSIONS, EmulatorServer, VmProfile

ROOT = Path(__file__).resolve().parents[2]
SE = "/metadata/scheduledevents"
BAD_VERSION = {
    "error": "Bad request. api-version is invalid or was not specified in the request. "
    "For more information refer to aka.ms/azureimds",
    "newest-versions": ["2025-04-07", "2024-07-17", "2024-03-15"],
}
MISSING_HEADER = {"error": "Bad request. Required metadata header not specified"}
GUID_A = "f020ba2e-3bc0-4c40-a10b-86575a9eabd5"
GUID_B = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"


class Response:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """One keep-alive connection, like the agent's poller."""

    def __init__(self, srv: EmulatorServer) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)

    def request(
        self, method: str, path: str, body: bytes | str | None = None, headers: dict[str, str] | None = None
    ) -> Response:
        self.conn.request(method, path, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        return Response(resp.status, resp.headers, resp.read())

    def imds(
        self,
        path: str = SE,
        version: str | None = "2020-07-01",
        method: str = "GET",
        body: bytes | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        target = path if version is None else f"{path}?api-version={version}"
        return self.request(method, target, body, {"Metadata": "true"} if headers is None else headers)

    def doc(self, version: str = "2020-07-01") -> dict[str, Any]:
        resp = self.imds(version=version)
        assert resp.status == 200, resp.body
        assert resp.headers["Content-Type"] == "application/json; charset=utf-8"
        return resp.json()

    def control(self, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
        body = None if payload is None else json.dumps(payload)
        resp = self.request(method, "/_emulator/" + path, body)
        return resp.status, resp.json()

    def state(self) -> dict[str, Any]:
        status, body = self.control("GET", "state")
        assert status == 200
        return body

    def advance(self, seconds: float) -> None:
        assert self.control("POST", "advance", {"seconds": seconds})[0] == 200

    def inject(self, **payload: Any) -> str:
        status, body = self.control("POST", "events", payload)
        assert status == 201, body
        return body["eventId"]

    def approve(self, *event_ids: str, version: str = "2020-07-01") -> Response:
        payload = {"StartRequests": [{"EventId": e} for e in event_ids]}
        return self.imds(version=version, method="POST", body=json.dumps(payload))

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def server() -> Iterator[EmulatorServer]:
    srv = EmulatorServer(rate_limit=0, approval_delay=2.0).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: EmulatorServer) -> Iterator[Client]:
    c = Client(server)
    yield c
    c.close()


# ---------------------------------------------------------------------- request rules


def test_metadata_header_required(client: Client) -> None:
    for headers in ({}, {"Metadata": "false"}, {"Metadata": "yes"}):
        resp = client.imds(headers=headers)
        assert resp.status == 400
        assert resp.json() == MISSING_HEADER
    assert client.imds(headers={"Metadata": "True"}).status == 200
    assert client.imds(path="/metadata/instance", version="2021-02-01", headers={}).json() == MISSING_HEADER


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?api-version=",
        "?api-version=2020-07-01&api-version=2020-07-01",
        "?api-version=2020-07-02",
        "?api-version=latest",
        "?api-version=2021-02-01",  # an instance version, not a scheduledevents one
        "?API-VERSION=2020-07-01",
    ],
)
def test_api_version_rejected(client: Client, query: str) -> None:
    resp = client.request("GET", SE + query, headers={"Metadata": "true"})
    assert resp.status == 400
    assert resp.json() == BAD_VERSION
    assert resp.headers["Content-Type"] == "application/json; charset=utf-8"


def test_instance_api_versions(client: Client) -> None:
    for version in ("2017-04-02", "2018-10-01", "2021-02-01", "2021-12-13", "2023-11-15", "2025-04-07"):
        assert client.imds("/metadata/instance", version).status == 200
    for version in ("2020-07-02", "2019-01-01", None):
        resp = client.imds("/metadata/instance", version)
        assert resp.status == 400 and resp.json() == BAD_VERSION


def test_x_forwarded_for_rejected(client: Client) -> None:
    resp = client.imds(headers={"Metadata": "true", "X-Forwarded-For": "10.0.0.9"})
    assert resp.status == 400
    assert resp.json() == {"error": "Bad request. X-Forwarded-For header is not allowed"}


def test_verbs_and_paths(client: Client) -> None:
    for method in ("PUT", "DELETE", "PATCH"):
        resp = client.imds(method=method, body="{}")
        assert resp.status == 405 and resp.json() == {"error": "Method not allowed"}
        assert resp.headers["Allow"] == "GET, POST"
        assert client.imds("/metadata/instance", "2021-02-01", method=method).status == 405
    for path in (
        "/metadata/scheduled",
        "/metadata/identity/oauth2/token",
        "/metadata/instance/compute/nope",
        "/",
    ):
        resp = client.imds(path, "2021-02-01")
        assert resp.status == 404 and resp.json() == {"error": "Not found"}
    rejected = client.state()["requests"]["rejected"]
    assert rejected["405"] == 6 and rejected["404"] == 4


def test_rate_limit() -> None:
    with EmulatorServer(rate_limit=5.0) as srv:
        c = Client(srv)
        statuses = [c.imds().status for _ in range(6)]
        assert statuses == [200] * 5 + [429]
        resp = c.imds()
        assert resp.status == 429 and resp.json() == {"error": "Too many requests"}
        for _ in range(10):  # control requests are not counted
            c.state()
        time.sleep(1.05)
        assert c.imds().status == 200
        assert c.state()["requests"]["rejected"]["429"] == 2
        c.close()


def test_keep_alive_and_content_length(client: Client) -> None:
    client.imds()
    sock = client.conn.sock
    assert sock is not None
    for path, version in ((SE, "2020-07-01"), ("/metadata/instance", "2021-02-01"), (SE, "2017-03-01")):
        resp = client.imds(path, version)
        assert resp.status == 200
        assert int(resp.headers["Content-Length"]) == len(resp.body)
        assert client.conn.sock is sock  # same TCP connection
    resp = client.imds(headers={})  # an error answer keeps the connection too
    assert resp.status == 400 and client.conn.sock is sock
    resp = client.approve(GUID_A)
    assert resp.status == 200 and resp.body == b"" and resp.headers["Content-Length"] == "0"
    assert client.conn.sock is sock


# ---------------------------------------------------------------------- document shapes


@pytest.mark.parametrize("version", SCHEDULED_EVENTS_VERSIONS)
def test_document_shape_per_version(client: Client, version: str) -> None:
    event_id = client.inject(
        eventType="Freeze", description="Host server is undergoing maintenance.", durationInSeconds=9
    )
    clock = client.state()["clock"]
    doc = client.doc(version)
    assert list(doc) == ["DocumentIncarnation", "Events"]
    assert isinstance(doc["DocumentIncarnation"], int)
    (event,) = doc["Events"]
    keys = ["EventId", "EventStatus", "EventType", "ResourceType", "Resources", "NotBefore"]
    if version >= "2019-04-01":
        keys.append("Description")
    if version >= "2019-08-01":
        keys.append("EventSource")
    if version >= "2020-07-01":
        keys.append("DurationInSeconds")
    assert list(event) == keys
    assert event["EventId"] == event_id
    assert event["ResourceType"] == "VirtualMachine"
    if version == "2017-03-01":
        assert event["Resources"] == ["_vm-bridge-0"]
        not_before = calendar.timegm(time.strptime(event["NotBefore"], "%Y-%m-%dT%H:%M:%SZ"))
    else:
        assert event["Resources"] == ["vm-bridge-0"]
        assert event["NotBefore"].endswith(" GMT")
        not_before = email.utils.parsedate_to_datetime(event["NotBefore"]).timestamp()
    assert abs(not_before - (clock + 900)) < 2
    if version >= "2020-07-01":
        assert event["DurationInSeconds"] == 9 and event["EventSource"] == "Platform"


def test_instance_metadata_single_vm(client: Client) -> None:
    doc = client.imds("/metadata/instance", "2021-02-01").json()
    compute = doc["compute"]
    assert compute["name"] == "vm-bridge-0"
    assert compute["osProfile"]["computerName"] == "vm-bridge-0"
    assert compute["vmScaleSetName"] == "" and compute["zone"] == "1"
    assert compute["resourceId"].endswith("/providers/Microsoft.Compute/virtualMachines/vm-bridge-0")
    for key in ("vmId", "subscriptionId", "resourceGroupName", "location", "platformFaultDomain", "vmSize"):
        assert compute[key]
    assert isinstance(compute["tagsList"], list)
    assert doc["network"]["interface"][0]["ipv4"]["ipAddress"][0]["privateIpAddress"] == "10.0.0.4"
    text = client.imds("/metadata/instance/compute/vmId", "2021-02-01&format=text")
    assert text.status == 200 and text.body.decode() == compute["vmId"]
    assert client.imds("/metadata/instance", "2021-02-01").json() == doc  # stable across calls


def test_instance_metadata_scale_set() -> None:
    with EmulatorServer(rate_limit=0, vm=VmProfile.scale_set("webvmss", 3)) as srv:
        c = Client(srv)
        compute = c.imds("/metadata/instance", "2021-02-01").json()["compute"]
        assert compute["name"] == "webvmss_3"
        assert compute["vmScaleSetName"] == "webvmss"
        assert compute["osProfile"]["computerName"] == "webvmss000003"
        assert compute["resourceId"].endswith("/virtualMachineScaleSets/webvmss/virtualMachines/3")
        c.close()
    assert (
        VmProfile.scale_set("aks-default-36328368-vmss", 18).computer_name
        == "aks-default-36328368-vmss00000i"
    )


# ---------------------------------------------------------------------- event flows


def test_live_migration_flow(client: Client) -> None:
    assert client.control("POST", "scenario", {"name": "live-migration"})[0] == 200
    first = client.doc()
    assert first["Events"] == []
    inc = first["DocumentIncarnation"]

    client.advance(5)  # lead-in
    doc = client.doc()
    assert doc["DocumentIncarnation"] == inc + 1
    (scheduled,) = doc["Events"]
    assert scheduled["EventStatus"] == "Scheduled" and scheduled["EventType"] == "Freeze"
    assert scheduled["EventSource"] == "Platform" and scheduled["DurationInSeconds"] == 5
    assert scheduled["Description"] == (
        "Virtual machine is being paused because of a memory-preserving Live Migration operation."
    )
    not_before = email.utils.parsedate_to_datetime(scheduled["NotBefore"]).timestamp()
    assert abs(not_before - (client.state()["clock"] + 900)) < 2

    client.advance(899)
    assert client.doc()["Events"][0]["EventStatus"] == "Scheduled"
    client.advance(1.5)  # past NotBefore: auto-approved
    doc = client.doc()
    assert doc["DocumentIncarnation"] == inc + 2
    (started,) = doc["Events"]
    assert started["EventStatus"] == "Started" and started["NotBefore"] == ""
    assert started["EventId"] == scheduled["EventId"]

    client.advance(300)
    doc = client.doc()
    assert doc == {"DocumentIncarnation": inc + 3, "Events": []}
    state = client.state()
    assert [h["incarnation"] for h in state["history"]][-3:] == [inc + 1, inc + 2, inc + 3]
    assert {str(inc), str(inc + 1), str(inc + 2), str(inc + 3)} <= set(state["firstServed"])


def test_held_transitions_wait_until_each_document_was_served() -> None:
    """``hold_until_served`` (issue 21): however far the clock runs, a polling client sees every
    state of an event, one document per poll, and the ticker does not spin while it waits."""
    srv = EmulatorServer(rate_limit=0, hold_until_served=True).start()
    client = Client(srv)
    try:
        event_id = client.inject(eventType="Freeze", noticeSeconds=10, startedSeconds=10)
        client.advance(3600)  # NotBefore and the end of Started are both long past
        statuses = []
        for _ in range(3):
            doc = client.doc()
            statuses.append([e["EventStatus"] for e in doc["Events"]])
        assert statuses == [["Scheduled"], ["Started"], []]
        assert [h["reason"] for h in client.state()["history"]][-2:] == ["started at NotBefore", "completed"]
        assert client.state()["events"] == [] and event_id
    finally:
        client.close()
        srv.stop()


def test_post_faults_take_or_drop_the_start_request(client: Client) -> None:
    event_id = client.inject(eventType="Freeze")
    assert client.control("POST", "faults", {"kind": "503", "on": "post"})[0] == 200
    assert client.approve(event_id).status == 503
    assert client.state()["startRequests"] == {}  # answered with an error: not taken
    assert client.control("POST", "faults", {"kind": "slow", "on": "post", "delaySeconds": 0.2})[0] == 200
    started = time.monotonic()
    assert client.approve(event_id).status == 200 and time.monotonic() - started >= 0.2
    state = client.state()
    assert state["startRequests"] == {event_id: 1} and state["requests"]["faults"] == {
        "post-503": 1,
        "post-slow": 1,
    }
    assert [p["eventIds"] for p in state["startRequestLog"]] == [[event_id]]
    assert client.control("POST", "faults", {"kind": "lost"})[0] == 400  # lost is for POSTs only
    assert client.doc()["Events"][0]["EventId"] == event_id  # GETs never met the POST faults


def test_approval(client: Client) -> None:
    event_id = client.inject(eventType="Reboot", eventSource="User")
    resp = client.approve(event_id)
    assert resp.status == 200 and resp.body == b""
    assert client.doc()["Events"][0]["EventStatus"] == "Scheduled"  # not necessarily at once
    assert client.state()["events"][0]["approved"] is True
    client.advance(2.1)  # the 2 s approval delay
    (event,) = client.doc()["Events"]
    assert event["EventStatus"] == "Started" and event["NotBefore"] == ""
    inc = client.doc()["DocumentIncarnation"]
    assert client.approve(event_id.lower()).status == 200  # already started, any case: still 200
    assert client.approve(GUID_A, GUID_B).status == 200  # unknown ids: still 200
    assert client.doc()["DocumentIncarnation"] == inc  # approvals alone change nothing
    state = client.state()
    assert state["startRequests"] == {event_id: 2}
    assert state["history"][-1]["reason"] == "started after approval"
    assert state["unknownStartRequests"] == 2
    assert state["requests"]["post"] == 3


def test_approval_2017_with_document_incarnation(client: Client) -> None:
    event_id = client.inject(eventType="Freeze")
    body = json.dumps({"DocumentIncarnation": "5", "StartRequests": [{"EventId": event_id}]})
    assert client.imds(version="2017-03-01", method="POST", body=body).status == 200
    assert client.state()["startRequests"] == {event_id: 1}


@pytest.mark.parametrize(
    "body",
    [
        "",
        "not json",
        "[]",
        "{}",
        '{"StartRequests": {"EventId": "f020ba2e-3bc0-4c40-a10b-86575a9eabd5"}}',
        '{"StartRequests": [{"EventID": "f020ba2e-3bc0-4c40-a10b-86575a9eabd5"}]}',
        '{"StartRequests": [{"EventId": 5}]}',
        '{"StartRequests": ["f020ba2e-3bc0-4c40-a10b-86575a9eabd5"]}',
        '{"StartRequests": [{"EventId": "not-a-guid"}]}',
        '{"StartRequests": [{"EventId": "f020ba2e3bc04c40a10b86575a9eabd5"}]}',
    ],
)
def test_malformed_post(client: Client, body: str) -> None:
    resp = client.imds(method="POST", body=body)
    assert resp.status == 400
    assert resp.json()["error"].startswith("Bad request.")
    assert client.state()["requests"]["post"] == 0


def test_empty_start_requests_is_well_formed(client: Client) -> None:
    assert client.imds(method="POST", body='{"StartRequests": []}').status == 200


def test_control_event_operations(client: Client) -> None:
    inc0 = client.doc()["DocumentIncarnation"]
    a = client.inject(eventType="Freeze", noticeSeconds=600, eventId=GUID_A)
    assert a == GUID_A
    b = client.inject(eventType="SomethingNew", resources=["vm-bridge-0", "vm-bridge-1"])
    doc = client.doc()
    assert doc["DocumentIncarnation"] == inc0 + 2
    assert [e["EventType"] for e in doc["Events"]] == ["Freeze", "SomethingNew"]  # unknown values kept
    assert doc["Events"][1]["Resources"] == ["vm-bridge-0", "vm-bridge-1"]

    old = doc["Events"][0]["NotBefore"]
    assert (
        client.control("POST", f"events/{a}/reschedule", {"noticeSeconds": 1800})[1]["documentIncarnation"]
        == inc0 + 3
    )
    assert client.doc()["Events"][0]["NotBefore"] != old
    assert client.control("POST", f"events/{a}/start")[0] == 200
    assert client.doc()["Events"][0]["EventStatus"] == "Started"
    assert client.control("POST", f"events/{a}/cancel")[0] == 409  # Started events cannot be canceled
    assert client.control("POST", f"events/{b}/cancel")[0] == 200
    assert client.control("POST", f"events/{a}/complete")[0] == 200
    assert client.doc() == {"DocumentIncarnation": inc0 + 6, "Events": []}
    assert client.control("POST", f"events/{a}/complete")[0] == 404
    assert (
        client.control("POST", "events", {"eventType": "Freeze", "eventId": GUID_A})[0] == 409
    )  # ids never reused
    assert client.control("POST", "events", {"eventType": "Freeze", "eventId": "x"})[0] == 400
    assert client.control("POST", "events", {})[0] == 400
    assert client.control("GET", "nope")[0] == 404
    assert client.control("DELETE", "state")[0] == 405

    started = client.inject(eventType="Reboot", status="Started", startedSeconds=60)
    (event,) = client.doc()["Events"]
    assert event["EventId"] == started and event["EventStatus"] == "Started" and event["NotBefore"] == ""
    client.advance(61)
    assert client.doc()["Events"] == []


def test_scenario_switch_and_reset_keep_incarnation_increasing(client: Client) -> None:
    client.control("POST", "scenario", {"name": "hardware-failure"})
    client.advance(5)
    inc = client.doc()["DocumentIncarnation"]
    assert client.doc()["Events"][0]["EventStatus"] == "Started"
    status, body = client.control("POST", "scenario", {"name": "user-reboot", "speed": 60})
    assert status == 200 and body["speed"] == 60 and body["documentIncarnation"] == inc + 1
    assert client.doc()["Events"] == []
    assert client.control("POST", "scenario", {"name": "nope"})[0] == 400
    client.advance(1)
    assert client.doc()["Events"][0]["EventType"] == "Reboot"
    assert client.control("POST", "reset")[1]["documentIncarnation"] == inc + 3
    state = client.state()
    assert state["scenario"] == "idle" and state["events"] == [] and state["clockOffsetSeconds"] == 0
    assert state["requests"]["get"] == 0


def test_event_ids_deterministic_and_never_repeated() -> None:
    ids = []
    for _ in range(2):
        with EmulatorServer(scenario="user-redeploy", rate_limit=0, speed=600) as srv:
            srv.state.advance(1)
            first = srv.state.snapshot()["events"][0]["eventId"]
            srv.state.start_scenario("user-redeploy")
            srv.state.advance(1)
            second = srv.state.snapshot()["events"][0]["eventId"]
            ids.append((first, second))
    assert ids[0] == ids[1]  # repeatable across emulator instances
    assert ids[0][0] != ids[0][1]  # a re-run inside one emulator gets new ids


def test_ticker_applies_transitions_without_requests(client: Client) -> None:
    client.inject(eventType="Freeze", noticeSeconds=0.2, startedSeconds=0.2)
    # Only control requests are sent (they never evaluate the schedule): the ticker alone moves it.
    wait_until(lambda: client.state()["history"][-1]["reason"] == "completed", 5, what="the event completed")
    history = client.state()["history"]
    appeared, started, gone = history[-3:]
    assert started["reason"] == "started at NotBefore" and gone["reason"] == "completed"
    # Applied by the ticker (state requests never evaluate the schedule), never before its time; how
    # late depends on the machine's load, so only the order and the earliest time are asserted.
    assert started["changedAt"] - appeared["changedAt"] >= 0.19
    assert gone["changedAt"] - started["changedAt"] >= 0.19


# ---------------------------------------------------------------------- faults and raw override


@pytest.mark.parametrize("kind", ["429", "500", "503", "410"])
def test_status_faults(client: Client, kind: str) -> None:
    assert client.control("POST", "faults", {"kind": kind})[0] == 200
    resp = client.imds()
    assert resp.status == int(kind)
    assert "error" in resp.json()
    assert client.imds().status == 200  # count defaults to 1
    assert client.state()["requests"]["faults"] == {kind: 1}


def test_fault_slow(client: Client) -> None:
    client.control("POST", "faults", {"kind": "slow", "delaySeconds": 0.4})
    t0 = time.monotonic()
    doc = client.doc()
    assert time.monotonic() - t0 >= 0.4
    assert doc["Events"] == []


def test_fault_garbage_truncated_wrong_types(client: Client) -> None:
    client.inject(eventType="Freeze")
    for kind in ("garbage", "truncated", "wrong-types"):
        client.control("POST", "faults", {"kind": kind})
    garbage = client.imds()
    assert garbage.status == 200
    with pytest.raises(json.JSONDecodeError):
        garbage.json()
    truncated = client.imds()
    assert truncated.status == 200 and int(truncated.headers["Content-Length"]) == len(truncated.body)
    with pytest.raises(json.JSONDecodeError):
        truncated.json()
    assert truncated.body.startswith(b'{"DocumentIncarnation"')
    wrong = client.imds().json()
    assert not isinstance(wrong["Events"], list)
    assert len(client.doc()["Events"]) == 1


def test_fault_drop(client: Client) -> None:
    client.control("POST", "faults", {"kind": "drop", "count": 2})
    for _ in range(2):
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            client.imds()
        client.conn.close()
    assert client.imds().status == 200


def test_fault_trickle(server: EmulatorServer, client: Client) -> None:
    """The whole answer, status line and headers included, one byte per delaySeconds, then as usual."""
    client.inject(eventType="Freeze")
    expected = client.doc()
    assert client.control("POST", "faults", {"kind": "trickle", "delaySeconds": 0.01})[0] == 200
    per_byte = 0.01
    request = f"GET {SE}?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\nMetadata: true\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request.encode())
        started = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            assert chunk, data
            data += chunk
        headers_took = time.monotonic() - started
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(h for h in head.split(b"\r\n") if h.startswith(b"Content-Length:")).split()[1])
        while len(body) < length:
            chunk = sock.recv(4096)
            assert chunk, body
            body += chunk
        took = time.monotonic() - started
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert headers_took >= (len(head) + 3) * per_byte  # the headers trickled too, not just the body
    assert took >= (len(head) + 4 + length) * per_byte
    assert json.loads(body) == expected
    assert client.state()["requests"]["faults"] == {"trickle": 1}
    assert client.doc() == expected  # count defaults to 1: the next answer is prompt


def test_fault_duration_and_clear(client: Client) -> None:
    client.control("POST", "faults", {"kind": "503", "durationSeconds": 0.5})
    assert [client.imds().status for _ in range(3)] == [503, 503, 503]
    time.sleep(0.55)
    assert client.imds().status == 200
    client.control("POST", "faults", {"kind": "500", "count": 5})
    assert client.imds().status == 500
    assert client.control("DELETE", "faults")[0] == 200
    assert client.imds().status == 200
    assert client.control("POST", "faults", {"kind": "teapot"})[0] == 400
    # faults only hit scheduledevents GETs
    client.control("POST", "faults", {"kind": "500"})
    assert client.imds("/metadata/instance", "2021-02-01").status == 200
    assert client.approve(GUID_A).status == 200
    assert client.imds().status == 500


def test_raw_override(client: Client) -> None:
    inc = client.doc()["DocumentIncarnation"]
    raw = '{"DocumentIncarnation": "0", "Events": [ ]}'
    assert client.control("PUT", "raw", {"body": raw})[0] == 200
    for version in ("2020-07-01", "2017-03-01"):
        resp = client.imds(version=version)
        assert resp.status == 200 and resp.body == raw.encode()
    client.control("PUT", "raw", {"body": "oops", "status": 500})
    resp = client.imds()
    assert resp.status == 500 and resp.body == b"oops"
    assert client.control("DELETE", "raw")[0] == 200
    assert client.doc()["DocumentIncarnation"] == inc
    assert client.state()["requests"]["raw"] == 3


# ---------------------------------------------------------------------- scenarios


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n not in ("idle", "tour")])
def test_scenario_runs_to_completion(name: str) -> None:
    speed = 600.0
    with EmulatorServer(scenario=name, speed=speed, rate_limit=0, approval_delay=0.5) as srv:
        c = Client(srv)
        statuses: dict[str, list[str]] = {}
        resources: dict[str, list[str]] = {}
        max_events = 0
        last_inc = 0
        elapsed = 0.0
        limit = SCENARIOS[name].length / speed
        phases = [p for s in SCENARIOS[name].steps for p in (s.spec.notice, s.spec.started_for) if p]
        step = min(0.1, min(phases) / speed / 2)
        while True:
            doc = c.doc()
            assert doc["DocumentIncarnation"] >= last_inc
            last_inc = doc["DocumentIncarnation"]
            max_events = max(max_events, len(doc["Events"]))
            for e in doc["Events"]:
                seen = statuses.setdefault(e["EventId"], [])
                if not seen or seen[-1] != e["EventStatus"]:
                    seen.append(e["EventStatus"])
                resources[e["EventId"]] = e["Resources"]
            state = c.state()
            if elapsed > 0 and not state["events"] and state["pendingSteps"] == 0:
                break
            assert elapsed <= limit + 1, f"{name} did not finish"
            c.advance(step)
            elapsed += step
        c.close()
    assert statuses, "no event seen"
    assert limit - 1.0 <= elapsed <= limit + 0.25  # wall time passing meanwhile can only shorten it
    expected = {"hardware-failure": [["Started"]], "canceled-maintenance": [["Scheduled"]]}
    assert list(statuses.values()) == expected.get(name, [["Scheduled", "Started"]] * len(statuses))
    names = next(iter(resources.values()))
    if name == "multi-vm":
        assert names == ["vm-bridge-0", "vm-bridge-1", "vm-bridge-2"]
    elif name == "terminate":
        assert names == ["webvmss_3"]
    else:
        assert names[0] == "vm-bridge-0"
    if name == "overlapping":
        assert len(statuses) == 2 and max_events == 2


def test_tour_finishes_within_50_seconds_at_speed_60() -> None:
    with EmulatorServer(scenario="tour", speed=60, rate_limit=0) as srv:
        c = Client(srv)
        types: set[str] = set()
        sources: set[str] = set()
        ended_at = None
        for second in range(1, 51):
            c.advance(1)
            doc = c.doc()
            for e in doc["Events"]:
                types.add(e["EventType"])
                sources.add(e["EventSource"])
            state = c.state()
            if not state["events"] and state["pendingSteps"] == 0:
                ended_at = second
                break
        c.close()
    assert ended_at is not None and ended_at <= 50
    assert types == {"Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"}
    assert sources == {"Platform", "User"}


def test_terminate_scenario_uses_scale_set_profile() -> None:
    with EmulatorServer(scenario="terminate", rate_limit=0) as srv:
        assert srv.vm.compute_name == "webvmss_3"


# ---------------------------------------------------------------------- fleets (availability sets)


def test_fleet_event_is_on_every_named_vm_and_one_approval_releases_it_for_all() -> None:
    """Issue 11's fleet harness: one event for an availability set appears on the document of every
    VM it names (same EventId), each VM keeps its own incarnation and request budget, and a
    StartRequest through any one of them starts it everywhere, counted once, on that VM."""
    from bridge.imds.emulator.fleet import fleet_profiles

    with EmulatorServer(fleet=fleet_profiles(3), rate_limit=5, approval_delay=0.0) as srv:
        vms = [Client(srv) for _ in range(3)]
        try:
            status, added = vms[0].control("POST", "fleet/events", {
                "eventType": "Reboot", "resources": ["fleet-vm-000", "fleet-vm-001", "vm-without-agent"],
            })  # fmt: skip
            assert status == 201, added
            docs = [c.imds(f"/vm/fleet-vm-00{i}{SE}").json() for i, c in enumerate(vms)]
            assert [d["DocumentIncarnation"] for d in docs] == [2, 2, 1]
            assert [[e["EventId"] for e in d["Events"]] for d in docs] == [[added["eventId"]]] * 2 + [[]]
            assert docs[0]["Events"][0]["Resources"] == ["fleet-vm-000", "fleet-vm-001", "vm-without-agent"]
            # Each VM has its own budget: five requests on VM 0 leave VM 1 at full allowance.
            assert [vms[0].imds(f"/vm/fleet-vm-000{SE}").status for _ in range(5)][-1] == 429
            assert vms[1].imds(f"/vm/fleet-vm-001{SE}").status == 200

            body = json.dumps({"StartRequests": [{"EventId": added["eventId"]}]})
            assert vms[1].imds(f"/vm/fleet-vm-001{SE}", method="POST", body=body).status == 200

            def started(vm: str, client: Client) -> bool:
                resp = client.imds(f"/vm/{vm}{SE}")
                return resp.status == 200 and resp.json()["Events"][0]["EventStatus"] == "Started"

            wait_until(lambda: started("fleet-vm-000", vms[0]) and started("fleet-vm-001", vms[1]), 10,
                       what="the event started on both VMs after one approval")  # fmt: skip
            fleet = vms[2].control("GET", "fleet")[1]
            (event,) = fleet["events"]
            assert event["startRequests"] == 1 and event["firstStartRequestVia"] == "fleet-vm-001"
            assert event["firstStartRequestAt"] >= event["addedAt"] == added["addedAt"]
            per_vm = {vm["name"]: vm["requests"]["post"] for vm in fleet["vms"]}
            assert per_vm == {"fleet-vm-000": 0, "fleet-vm-001": 1, "fleet-vm-002": 0}
            assert fleet["requests"]["rejected"]["429"] >= 1
            # Each VM's own control API answers for that VM alone.
            assert vms[0].control("GET", "../vm/fleet-vm-000/_emulator/state")[0] == 404  # no path tricks
            assert vms[0].request("GET", "/vm/fleet-vm-001/_emulator/state").json()["startRequests"] == {
                added["eventId"]: 1
            }
            assert vms[0].request("GET", "/vm/fleet-vm-000/_emulator/state").json()["startRequests"] == {}
            # Unknown VMs and unprefixed paths are not part of the fleet.
            assert vms[0].imds(f"/vm/fleet-vm-999{SE}").status == 404
            assert vms[0].imds(SE).status == 404
            again = {"eventType": "Freeze", "resources": ["fleet-vm-002"], "eventId": added["eventId"]}
            assert vms[0].control("POST", "fleet/events", again)[0] == 409  # no VM gets half of an event
            assert vms[2].imds(f"/vm/fleet-vm-002{SE}").json()["Events"] == []
            status, error = vms[0].control(
                "POST", "fleet/events", {"eventType": "Freeze", "resources": ["x"]}
            )
            assert status == 400 and "at least one VM" in error["error"]
        finally:
            for client in vms:
                client.close()


def test_fleet_command_line_lists_every_vm() -> None:
    with emulator_process("--fleet", "4", "--fleet-first-ip", "127.0.9.250") as line:
        ips = [vm["privateIp"] for vm in line["fleet"]]
        assert ips == ["127.0.9.250", "127.0.9.251", "127.0.9.252", "127.0.9.253"]
        assert line["fleet"][3]["url"] == line["url"] + "/vm/fleet-vm-003"


# ---------------------------------------------------------------------- command line


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@contextlib.contextmanager
def emulator_process(*args: str) -> Iterator[dict[str, Any]]:
    """``python -m bridge.imds.emulator --port 0 *args``, yielding its first stdout line; on
    leaving, SIGTERM must end it with exit code 0 (killed if the block failed first)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge.imds.emulator", "--port", "0", *args],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield json.loads(proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_module_entry_point_prints_url_and_stops_on_sigterm() -> None:
    with emulator_process("--scenario", "hardware-failure", "--speed", "60") as line:
        assert line["msg"] == "emulator listening"
        host_port = line["url"].removeprefix("http://")
        conn = http.client.HTTPConnection(host_port, timeout=5)
        conn.request("GET", SE + "?api-version=2020-07-01", headers={"Metadata": "true"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert "DocumentIncarnation" in json.loads(resp.read())
        conn.close()


def test_list_scenarios() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bridge.imds.emulator", "--list-scenarios"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    for name in SCENARIOS:
        assert name in out
