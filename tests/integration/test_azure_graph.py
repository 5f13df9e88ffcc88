"""Resource Graph as Azure's channel's second input: the real azure-core pipeline against a local HTTPS
fake of ARM (tests/peers/fake_arm.py: Resource Graph cannot run here), with paging, the per-user quota
headers, a 429 and a poll that cannot finish; then the service itself polling it, publishing only
what changed between polls."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from azure_events import RG, SUB, grid_event
from peers.fake_arm import FakeArm, FakeCredential
from procs import wait_until

from bridge.azure.graph import API_VERSION, QUERY, GraphUnavailable, ResourceGraphReader
from bridge.azure.service import AzureChannel
from bridge.sinks import create_sink

AUDIENCE = "https://management.azure.com"


@pytest.fixture
def arm(tmp_path: Path) -> Iterator[FakeArm]:
    fake = FakeArm(tmp_path, AUDIENCE)
    yield fake
    fake.server.shutdown()


def row(event_id: str, status: str, vm: str = "vm-a") -> dict[str, Any]:
    info = grid_event(event_id, status, [vm])["data"]["resourceInfo"]
    return {**info, "resourceGroup": RG, "subscriptionId": SUB}


def page(rows: list[dict[str, Any]], skip: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"totalRecords": len(rows), "count": len(rows), "data": rows}
    if skip:
        body["$skipToken"] = skip
    return body


def reader(arm: FakeArm, **kwargs: Any) -> ResourceGraphReader:
    return ResourceGraphReader(
        FakeCredential(), (SUB,), arm.url, audience=AUDIENCE, ca_file=arm.ca_file, **kwargs
    )


def test_every_page_is_read_with_the_documented_request(arm: FakeArm) -> None:
    e1, e2, e3 = (str(uuid.uuid4()) for _ in range(3))
    arm.script = [(200, {}, page([row(e1, "Scheduled"), row(e2, "Started")], skip="next-1")),
                  (200, {}, page([row(e3, "Completed")]))]  # fmt: skip
    rows = reader(arm).rows()
    assert [r["name"] for r in rows] == [e1, e2, e3]
    first, second = (json.loads(r["body"]) for r in arm.requests)
    assert (
        arm.requests[0]["path"] == f"/providers/Microsoft.ResourceGraph/resources?api-version={API_VERSION}"
    )
    assert arm.requests[0]["aud"] == AUDIENCE
    assert first == {
        "subscriptions": [SUB],
        "query": QUERY,
        "options": {"resultFormat": "objectArray", "$top": 1000},
    }
    assert second["options"]["$skipToken"] == "next-1"


def test_the_quota_and_a_429_are_waited_out_and_a_poll_gives_up_at_its_deadline(arm: FakeArm) -> None:
    slept: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    spent = {"x-ms-user-quota-remaining": "0", "x-ms-user-quota-resets-after": "00:00:04"}
    arm.script = [
        (200, spent, page([row(str(uuid.uuid4()), "Scheduled")], skip="p2")),  # quota spent: wait 4 s
        (429, {"Retry-After": "3"}, {"error": {"code": "RateLimiting"}}),  # then throttled: wait 3 s
        (200, {}, page([])),
    ]
    assert len(reader(arm, clock=lambda: now[0], sleep=sleep).rows()) == 1
    assert slept == [4.0, 3.0] and len(arm.requests) == 3
    arm.script = [(429, {"Retry-After": "30"}, {})]
    with pytest.raises(GraphUnavailable, match="throttled"):
        reader(arm, clock=lambda: now[0], sleep=sleep, deadline=10).rows()
    arm.script = [
        (403, {}, {"error": {"code": "AuthorizationFailed", "message": "no read on the subscription"}})
    ]
    with pytest.raises(GraphUnavailable, match="403: AuthorizationFailed"):
        reader(arm).rows()


@contextlib.contextmanager
def channel_polling(arm: FakeArm, tmp_path: Path) -> Iterator[Path]:
    """The Azure channel service, in this process, polling the fake Resource Graph every 0.2 s with a
    2 s grace (an outcome is settled after it: issue 33); its file sink's path. Stopped on exit."""
    import threading

    sink = tmp_path / "azure.jsonl"
    service = AzureChannel([], [create_sink(f"file://{sink}")], tmp_path / "state", grace=2,
                           graph=reader(arm), graph_interval=0.2)  # fmt: skip
    runner = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    try:
        yield sink
    finally:
        service.stop_event.set()
        runner.join(30)


def published(sink: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in sink.read_bytes().splitlines()] if sink.exists() else []


def test_the_service_publishes_only_what_changed_between_polls(arm: FakeArm, tmp_path: Path) -> None:
    e1, e2 = str(uuid.uuid4()), str(uuid.uuid4())
    polls = [
        [row(e1, "Scheduled"), row(e2, "Scheduled", "vm-b")],
        [row(e1, "Scheduled"), row(e2, "Scheduled", "vm-b")],  # nothing changed: nothing published
        [row(e1, "Started"), row(e2, "Canceled", "vm-b"), {"id": "junk"}],  # two changes, one refusal
    ]
    arm.script = [(200, {}, page(rows)) for rows in polls]
    with channel_polling(arm, tmp_path) as sink:
        wait_until(lambda: len(arm.requests) >= 4, 20, what="four polls")
        outcome = lambda: any(r.get("finding") == "outcome" for r in published(sink))  # noqa: E731
        wait_until(outcome, 20, what="the outcome, after the grace")
    records = published(sink)
    azure = [
        (r["event"]["eventId"], r["event"]["eventStatus"])
        for r in records
        if r["recordType"] == "azureScheduledEvent"
    ]
    assert azure == [(e1, "Scheduled"), (e2, "Scheduled"), (e1, "Started"), (e2, "Canceled")]
    assert all(
        r["source"]["channel"] == "resourceGraph" for r in records if r["recordType"] == "azureScheduledEvent"
    )
    outcomes = [r for r in records if r["recordType"] == "reconciliation" and r["finding"] == "outcome"]
    assert [(o["eventId"], o["azureState"]) for o in outcomes] == [(e2, "Canceled")]
    dead = (tmp_path / "state" / "dead-letter" / "azure-refused.jsonl").read_bytes().splitlines()
    assert [orjson.loads(d)["position"] for d in dead] == ["resourceGraph"]


def test_a_poison_row_is_refused_alone_and_the_poll_thread_lives_on(arm: FakeArm, tmp_path: Path) -> None:
    """Issue 31, finding 6: ``DurationInSeconds: "²"`` passed ``str.isdigit()`` and ``int()`` raised,
    which killed the polling thread with ``/readyz`` still 200. Now that row is dead-lettered, the
    valid row beside it published, and the next polls go on."""
    good, poison, later = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    bad = row(poison, "Scheduled")
    bad["properties"] = {**bad["properties"], "DurationInSeconds": "²"}
    arm.script = [(200, {}, page([bad, row(good, "Scheduled")])), (200, {}, page([row(later, "Scheduled")]))]

    def events(sink: Path) -> set[str]:
        return {r["event"]["eventId"] for r in published(sink) if "event" in r}

    with channel_polling(arm, tmp_path) as sink:
        wait_until(lambda: len(arm.requests) >= 3, 20, what="polls after the poison row")
        wait_until(lambda: {good, later} <= events(sink), 20, what="the valid rows published")
    assert poison not in events(sink)
    dead = [
        orjson.loads(d)
        for d in (tmp_path / "state/dead-letter/azure-refused.jsonl").read_bytes().splitlines()
    ]
    assert [d["reason"] for d in dead] == ["malformed"] and poison in dead[0]["payload"]


def test_an_endless_skip_token_and_a_nan_quota_header_are_refused(arm: FakeArm) -> None:
    """Issue 31, finding 6: an endless ``$skipToken`` grew the process by a gigabyte; ``nan`` in
    the quota header was read as a number."""
    from bridge.azure import graph

    endless = [
        (200, {}, page([row(str(uuid.uuid4()), "Scheduled")], skip=f"p{n}"))
        for n in range(graph.MAX_PAGES + 5)
    ]
    arm.script = endless
    with pytest.raises(GraphUnavailable, match="more than 200 pages"):
        reader(arm).rows()
    assert len(arm.requests) == graph.MAX_PAGES
    slept: list[float] = []
    nan = {"x-ms-user-quota-remaining": "0", "x-ms-user-quota-resets-after": "nan:nan:nan"}
    arm.script = [(200, nan, page([row(str(uuid.uuid4()), "Scheduled")], skip="p2")), (200, {}, page([]))]
    assert len(reader(arm, sleep=slept.append).rows()) == 1
    assert slept == []  # an unreadable reset time waits for nothing (never NaN seconds)
    for value in ("nan", "inf:0:0", "1e9:0:0", "-1:00:00", "²:00:00"):
        assert graph._duration(value) is None
