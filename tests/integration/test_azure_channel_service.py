"""``se-bridge azure-channel`` as a real process.

* Event Grid -> Event Hub: Event Grid cannot run here, so the test plays Event Grid: it writes the
  events Event Grid would deliver (both shapes: Microsoft's page and real captures; one wrapped in an
  array as Event Grid hands subscribers) with the real azure-eventhub SDK into the AMQP test peer
  (``tests/peers/amqp_eventhubs.py``), with a redelivery, a Completed before its Started, and three
  deliveries that are no usable event. The service reads them with the real SDK; the test asserts what
  reached the file sink, the dead letter and ``/metrics``.
* 20 VMs, 3 agents stopped: the fleet IMDS emulator with 20 VMs and a real agent on 17 of them; Azure's
  channel (again played by the test, as a file of Event Grid events) publishes an event for every VM:
  exactly the 3 VMs without an agent are found unwatched within the grace (0 false), ``/v1/unwatched``
  lists them, and every event gets its outcome once Azure says it completed.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from azure_events import grid_event
from brokers import free_port
from peers.amqp_eventhubs import EventHubsPeer
from procs import Agent, Emulator, scrape, wait_until

from bridge.imds.emulator.profile import DEFAULT_RESOURCE_GROUP, DEFAULT_SUBSCRIPTION_ID
from bridge.schemas import validate_record
from bridge.signing import KeyRing, verify_record

PY = sys.executable
EH_KEY = secrets.token_urlsafe(32)


class Channel:
    """The service, its file sink and its API."""

    def __init__(
        self, workdir: Path, *args: str, env: dict[str, str] | None = None, state: Path | None = None
    ) -> None:
        self.sink = workdir / "azure.jsonl"
        self.state = state or workdir / "state"
        self.api = f"http://127.0.0.1:{free_port()}"
        self.log = workdir / "azure-channel.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [PY, "-m", "bridge", "azure-channel", "--sink", f"file://{self.sink}",
                 "--state-dir", str(self.state), "--listen", self.api.removeprefix("http://"), *args],
                stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **(env or {})},
            )  # fmt: skip
        wait_until(self.ready, 60, what="azure-channel ready")

    def ready(self) -> bool:
        try:
            return requests.get(self.api + "/readyz", timeout=2, proxies={"http": ""}).status_code == 200
        except requests.ConnectionError:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            return False

    def records(self, record_type: str | None = None) -> list[dict[str, Any]]:
        lines = self.sink.read_bytes().splitlines() if self.sink.exists() else []
        found = [orjson.loads(line) for line in lines]
        return [r for r in found if record_type in (None, r["recordType"])]

    def findings(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records("reconciliation") if r["finding"] == kind]

    def metric(self, name: str, **labels: str) -> float:
        return scrape(self.api, name, **labels)

    def stop(self) -> None:
        self.proc.terminate()
        assert self.proc.wait(30) == 0


@pytest.fixture
def peer() -> Iterator[EventHubsPeer]:
    with EventHubsPeer({"azure-events": 2}, keys={"K": EH_KEY}) as p:
        yield p
    assert p.errors == [], p.errors


def test_event_grid_through_event_hubs_deduplicated_in_order_and_junk_dead_lettered(
    peer: EventHubsPeer, tmp_path: Path
) -> None:
    from azure.eventhub import EventData, EventHubProducerClient

    env = {"EH_CONN": peer.connection_string("azure-events", "K", EH_KEY)}
    spec = f"eventhubs://127.0.0.1:{peer.port}/azure-events?connection_string_env=EH_CONN&open_timeout=10"
    # an outcome is settled after the grace (issue 33): a short one here
    channel = Channel(tmp_path, "--source", spec, "--grace", "3", env=env)
    e1, e2 = str(uuid.uuid4()), str(uuid.uuid4())
    junk_id = grid_event(str(uuid.uuid4()), "Scheduled", ["vm-x"])
    junk_id["data"]["resourceInfo"]["id"] = "/subscriptions/x/resourceGroups/../../secrets"
    deliveries: list[bytes] = [
        orjson.dumps(grid_event(e1, "Scheduled", ["vm-a"], delivery_id="d1")),
        orjson.dumps(grid_event(e1, "Scheduled", ["vm-a"], delivery_id="d1")),  # a redelivery
        orjson.dumps(grid_event(e1, "Completed", ["vm-a"], delivery_id="d3")),  # before its Started
        orjson.dumps(grid_event(e1, "Started", ["vm-a"], delivery_id="d2")),
        orjson.dumps(
            [
                grid_event(
                    e2, "Scheduled", ["web_3"], parent="web", kind="virtualMachineScaleSets", shape="capture"
                )
            ]
        ),
        orjson.dumps(grid_event(str(uuid.uuid4()), "Scheduled", ["aks"], resource_type="ManagedCluster")),
        orjson.dumps(junk_id),
        b"\x00 not json",
    ]
    producer = EventHubProducerClient.from_connection_string(env["EH_CONN"])
    with producer:
        for payload in deliveries:  # one partition: Event Grid's order, which the test reverses itself
            batch = producer.create_batch(partition_id="0")
            batch.add(EventData(payload))
            producer.send_batch(batch)
    try:
        wait_until(lambda: len(channel.records("azureScheduledEvent")) >= 4, 60, what="the records")
        wait_until(lambda: channel.findings("outcome"), 30, what="the outcome, after the grace")
        wait_until(lambda: channel.metric("se_bridge_azure_refused_total") >= 3, 30, what="the refusals")
        azure = channel.records("azureScheduledEvent")
        assert [(r["event"]["eventId"], r["event"]["eventStatus"], r["state"], r["late"]) for r in azure] == [
            (e1, "Scheduled", "Scheduled", False),
            (e1, "Completed", "Completed", False),
            (e1, "Started", "Completed", True),  # published, but the event does not move back
            (e2, "Scheduled", "Scheduled", False),
        ]
        assert azure[3]["vms"][0]["resourceId"].endswith("/virtualMachineScaleSets/web/virtualMachines/3")
        assert azure[3]["source"]["apiVersion"] == "2020-03-01"  # the capture's shape
        (outcome,) = channel.findings("outcome")
        assert (outcome["eventId"], outcome["azureState"]) == (e1, "Completed")
        assert all(validate_record(r) == [] for r in channel.records())
        assert channel.metric("se_bridge_azure_events_total", result="duplicate") == 1
        assert channel.metric("se_bridge_azure_events_total", result="late") == 1
        dead = [
            orjson.loads(line)
            for line in (channel.state / "dead-letter" / "azure-refused.jsonl").read_bytes().splitlines()
        ]
        assert sorted(d["reason"] for d in dead) == ["malformed", "notJson", "otherResourceType"]
        assert all(d["payload"] for d in dead)
    finally:
        channel.stop()
    # Restarted on the same state: what was committed is not read (nor published) again.
    before = len(channel.records())
    channel = Channel(tmp_path, "--source", spec, env=env)
    try:
        wait_until(lambda: channel.metric("se_bridge_outbox_records") >= 0, 10, what="metrics")
        assert channel.metric("se_bridge_azure_events_total") == 0
    finally:
        channel.stop()
    assert len(channel.records()) == before
    assert EH_KEY not in channel.log.read_text()


def test_twenty_vms_three_without_an_agent_exactly_three_unwatched_and_every_outcome(tmp_path: Path) -> None:
    emulator = Emulator("--fleet", "20", "--fleet-first-ip", "127.77.0.1")
    vms = [vm["name"] for vm in emulator.info["fleet"]]
    silent = set(vms[4:7])  # their agents are stopped (never started here)
    agents: list[Agent] = []
    grid = tmp_path / "event-grid.jsonl"
    grid.touch()
    channel: Channel | None = None
    try:
        for vm in emulator.info["fleet"]:
            if vm["name"] in silent:
                continue
            (tmp_path / vm["name"]).mkdir()
            agents.append(Agent(vm["url"], tmp_path / vm["name"]).start())
        sources = [arg for a in agents for arg in ("--events-source", f"file://{a.sink_path}")]
        (tmp_path / "azure.key").write_bytes(b"s" * 40)
        signing = ("--sign-key", f"azure={tmp_path / 'azure.key'}")
        channel = Channel(tmp_path, "--source", f"file://{grid}", "--grace", "8", *signing, *sources)
        events = {vm: emulator.control("POST", "fleet/events", {"eventType": "Reboot", "resources": [vm],
                                                                 "noticeSeconds": 900})["eventId"]
                  for vm in vms}  # fmt: skip

        def azure_says(status: str) -> None:
            with grid.open("ab") as out:
                for vm, event_id in events.items():
                    event = grid_event(
                        event_id, status, [vm], sub=DEFAULT_SUBSCRIPTION_ID, rg=DEFAULT_RESOURCE_GROUP
                    )
                    out.write(orjson.dumps(event) + b"\n")

        azure_says("Scheduled")
        wait_until(lambda: len(channel.findings("unwatched")) >= 3, 60, what="three unwatched VMs")
        unwatched = requests.get(channel.api + "/v1/unwatched", timeout=5, proxies={"http": ""}).json()
        assert sorted(u["vm"] for u in unwatched["unwatched"]) == sorted(silent)
        assert channel.metric("se_bridge_azure_unwatched_vms") == 3
        azure_says("Completed")
        wait_until(lambda: len(channel.findings("outcome")) >= 20, 60, what="every outcome")
        found = channel.findings("unwatched")
        assert sorted(f["vm"]["name"] for f in found) == sorted(silent)  # exactly these, 0 false
        assert {f["eventId"] for f in channel.findings("outcome")} == set(events.values())
        watched = {o["eventId"]: o["agentVms"] for o in channel.findings("outcome")}
        assert all((len(watched[events[vm]]) == 0) == (vm in silent) for vm in vms)
        assert channel.findings("agentOnly") == []
        assert all(validate_record(r) == [] for r in channel.records())
        keys = KeyRing({"azure": b"s" * 40})  # what a fleet approver's --azure-key verifies
        assert all(verify_record(keys, r) for r in channel.records())
    finally:
        if channel is not None:
            channel.stop()
        for agent in agents:
            agent.stop()
        emulator.stop()


def test_a_full_disk_holds_azures_events_back_and_loses_none(tmp_path: Path) -> None:
    """The service's state directory (its outbox) on a full tmpfs while Azure's events arrive: nothing
    can be stored, so nothing is committed at the source (its cursor stays) and the service does not
    crash; once there is room, every event is published, once."""
    from faults import fill, tmpfs

    grid = tmp_path / "event-grid.jsonl"
    grid.touch()
    with tmpfs(tmp_path / "azure-state", "2m") as state:
        channel = Channel(tmp_path, "--source", f"file://{grid}", state=state)
        try:
            filler = fill(state)
            ids = [str(uuid.uuid4()) for _ in range(5)]
            with grid.open("ab") as out:
                out.write(
                    b"".join(
                        orjson.dumps(grid_event(i, "Scheduled", [f"vm-{n}"])) + b"\n"
                        for n, i in enumerate(ids)
                    )
                )
            wait_until(lambda: b"storing Azure channel records" in channel.log.read_bytes(), 30,
                       what="the service waiting for its full disk")  # fmt: skip
            assert channel.records() == [] and channel.proc.poll() is None
            assert not any(state.glob("source-file-*.cursor"))  # nothing committed
            filler.unlink()
            wait_until(lambda: len(channel.records("azureScheduledEvent")) >= 5, 60, what="every event")
            assert sorted(r["event"]["eventId"] for r in channel.records("azureScheduledEvent")) == sorted(
                ids
            )
        finally:
            channel.stop()


def test_event_states_a_full_disk_refused_are_written_with_the_next_commit(tmp_path: Path) -> None:
    """The tracker's SQLite file on a full tmpfs: the commit is refused (OSError, counted), the
    observations' answers hold in memory, and once there is room the next commit writes them too,
    though their keys are not in that batch (a restart then still knows them: no state moves back)."""
    from faults import fill, tmpfs

    from bridge.azure.events import from_event_grid
    from bridge.azure.tracker import EventTracker, News

    first = [from_event_grid(grid_event(str(uuid.uuid4()), "Completed", [f"vm-{n}"])) for n in range(50)]
    later = from_event_grid(grid_event(str(uuid.uuid4()), "Scheduled", ["vm-z"]))
    with tmpfs(tmp_path / "state", "1m") as state:
        tracker = EventTracker(state_path=state / "azure-events.sqlite")
        tracker.observe(from_event_grid(grid_event(str(uuid.uuid4()), "Scheduled", ["vm-0"])))
        filler = fill(state)
        assert all(tracker.observe(e) is not None for e in first)
        with pytest.raises(OSError, match="cannot keep the events' states"):
            tracker.persist(first)
        assert tracker.errors["write"] >= 1
        assert all(tracker.observe(e) is None for e in first)  # still known in memory
        filler.unlink()
        tracker.observe(later)
        tracker.persist([later])  # only `later` in this batch
        tracker.close()
        again = EventTracker(state_path=state / "azure-events.sqlite")
        late = [from_event_grid(grid_event(e.event_id, "Started", list(e.resources))) for e in first]
        assert {again.observe(e) for e in late} == {News("Completed", late=True)}
        assert again.observe(later) is None


def test_a_state_directory_deleted_under_azure_channel_stops_it_with_exit_70(tmp_path: Path) -> None:
    """Issue 32: the agent and the approver stop (exit 70) when their state directory is deleted
    under them; Azure's channel went on writing into unlinked files. It stops the same way now."""
    import shutil

    grid = tmp_path / "event-grid.jsonl"
    grid.touch()
    channel = Channel(tmp_path, "--source", f"file://{grid}")
    shutil.rmtree(channel.state)
    assert channel.proc.wait(30) == 70
    assert "was deleted" in channel.log.read_text() or ".lock is gone" in channel.log.read_text()


@pytest.mark.parametrize("stop", ["sigterm", "kill -9"])
def test_an_events_state_never_moves_back_across_a_restart(tmp_path: Path, stop: str) -> None:
    """Issue 33: Completed for event E, a restart, then a late Started for E: the new record said
    ``state: Started, late: false`` (without the restart: ``Completed, late: true``)."""
    import signal

    event_id = str(uuid.uuid4())
    grid = tmp_path / "event-grid.jsonl"
    grid.write_bytes(b"".join(orjson.dumps(grid_event(event_id, s, ["vm-a"])) + b"\n"
                              for s in ("Scheduled", "Completed")))  # fmt: skip
    state = tmp_path / "state"
    channel = Channel(tmp_path, "--source", f"file://{grid}", state=state)

    def states() -> list[tuple[str, bool]]:
        return [(r["state"], r["late"]) for r in channel.records("azureScheduledEvent")]

    wait_until(lambda: len(states()) == 2, 30, what="Scheduled and Completed published")
    if stop == "sigterm":
        channel.stop()
    else:
        channel.proc.send_signal(signal.SIGKILL)
        channel.proc.wait(10)
    with grid.open("ab") as out:
        out.write(orjson.dumps(grid_event(event_id, "Started", ["vm-a"])) + b"\n")
    channel = Channel(tmp_path, "--source", f"file://{grid}", state=state)
    try:
        wait_until(lambda: len(states()) >= 3, 30, what="the late Started published")
        assert states()[-1] == ("Completed", True)
    finally:
        channel.stop()


def test_an_unreadable_state_file_is_set_aside_counted_and_the_service_runs_on(tmp_path: Path) -> None:
    """The events' state file (SQLite, issue 33) corrupted on disk: the service starts, says so in its
    log and a metric, keeps the bad file for a post-mortem, and publishes what it reads."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "azure-events.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 64)
    grid = tmp_path / "event-grid.jsonl"
    grid.write_bytes(orjson.dumps(grid_event(str(uuid.uuid4()), "Scheduled", ["vm-a"])) + b"\n")
    channel = Channel(tmp_path, "--source", f"file://{grid}", state=state)
    try:
        wait_until(lambda: channel.records("azureScheduledEvent"), 30, what="the event published")
        assert channel.metric("se_bridge_azure_state_errors_total", kind="corrupt") == 1
        assert list(state.glob("azure-events.sqlite.corrupt-*"))
        assert "cannot be read; moved aside" in channel.log.read_text()
    finally:
        channel.stop()


def test_a_backlog_is_read_no_faster_than_its_events_settle(tmp_path: Path) -> None:
    """Issue 33, "bounded whatever the backlog": a backlog is read faster than the grace settles its
    events, and each held ~2.4 KB until then (120 000 deliveries: 84 MB). Past ``max_in_grace`` events
    the Azure reader waits for the oldest to settle; nothing is lost. In this process: 1 500 events of
    VMs without agents, a 2 s grace, at most 100 in grace (and one batch read before the check)."""
    import threading

    from bridge.azure.service import MAX_BATCH, AzureChannel
    from bridge.sinks import create_sink
    from bridge.streams import create_source

    grid = tmp_path / "grid.jsonl"
    ids = [str(uuid.uuid4()) for _ in range(1500)]
    grid.write_bytes(b"".join(orjson.dumps(grid_event(e, s, [f"vm-{n:04d}"])) + b"\n"
                              for n, e in enumerate(ids) for s in ("Scheduled", "Completed")))  # fmt: skip
    sink, state = tmp_path / "azure.jsonl", tmp_path / "state"
    service = AzureChannel(
        [create_source(f"file://{grid}", state, "g")], [create_sink(f"file://{sink}")], state,
        grace=2.0, max_in_grace=100,
    )  # fmt: skip
    runner = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    most = 0

    def records() -> list[dict[str, Any]]:
        data = sink.read_bytes() if sink.exists() else b""
        whole = data[: data.rfind(b"\n") + 1]  # the sink may be mid-line: whole lines only
        return [orjson.loads(line) for line in whole.splitlines()]

    def settled() -> bool:
        nonlocal most
        most = max(most, service.reconciler.in_grace())
        return sum(r["recordType"] == "reconciliation" for r in records()) >= 3000

    try:
        wait_until(settled, 240, interval=0.01, what="every event's findings")
        got = records()
        assert sorted(
            r["event"]["eventId"] for r in got if r["recordType"] == "azureScheduledEvent"
        ) == sorted(ids * 2)  # every change once
        findings = [(r["finding"], r["eventId"]) for r in got if r["recordType"] == "reconciliation"]
        assert sorted(findings) == sorted([("outcome", e) for e in ids] + [("unwatched", e) for e in ids])
        assert 100 <= most <= 100 + MAX_BATCH, most  # it paused, and only there
        assert service.reconciler.in_grace() == 0
        assert service.reconciler.counts()[0] == 0  # settled: none held
        assert all(service.tracker.ended(e) for e in ids)  # what a late word is checked against
    finally:
        service.stop_event.set()
        runner.join(30)


def test_the_agents_stream_is_read_while_the_azure_readers_wait(tmp_path: Path) -> None:
    """The pause that bounds a backlog (MAX_IN_GRACE) must never hold the agents' records back: read
    late, they would make watched VMs look unwatched. With the cap at 0 the Azure reader never reads;
    the agents' record is still read (its event becomes known, in its grace)."""
    import threading

    import records as make

    from bridge.azure.service import AzureChannel
    from bridge.sinks import create_sink
    from bridge.streams import create_source

    grid, agents = tmp_path / "grid.jsonl", tmp_path / "agents.jsonl"
    grid.write_bytes(orjson.dumps(grid_event(str(uuid.uuid4()), "Scheduled", ["vm-a"])) + b"\n")
    sub, rg = DEFAULT_SUBSCRIPTION_ID, DEFAULT_RESOURCE_GROUP
    rid = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/vm-b"
    vm = make.vm_block(
        "vm-b", vm_id=str(uuid.uuid4()), resource_id=rid, subscription_id=sub, resource_group=rg
    )
    agents.write_bytes(
        orjson.dumps(make.scheduled_events(vm, [make.event(str(uuid.uuid4()), "vm-b")])) + b"\n"
    )
    sink, state = tmp_path / "azure.jsonl", tmp_path / "state"
    service = AzureChannel(
        [create_source(f"file://{grid}", state, "g")], [create_sink(f"file://{sink}")], state,
        events_sources=[create_source(f"file://{agents}", state, "a")], max_in_grace=0,
    )  # fmt: skip
    runner = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    try:
        wait_until(lambda: service.reconciler.counts()[0] == 1, 30, what="the agent's record read")
        assert service.reconciler.in_grace() == 1
        assert not sink.exists() or b"azureScheduledEvent" not in sink.read_bytes()  # Azure's waits
    finally:
        service.stop_event.set()
        runner.join(30)


def test_a_batch_the_full_outbox_refuses_midway_is_stored_once(tmp_path: Path) -> None:
    """Issue 33 (found by bench/azure_bench.py --backlog 40000: 8 152 records published twice): a
    poll's batch larger than the room left in the outbox was appended again from its start after each
    refusal. The service runs in this process with a 100-record outbox and a sink that is down (its
    directory missing) until the outbox is full; 300 events wait in the source."""
    import threading

    from bridge.azure.service import AzureChannel
    from bridge.sinks import create_sink
    from bridge.streams import create_source

    grid = tmp_path / "grid.jsonl"
    ids = [str(uuid.uuid4()) for _ in range(300)]
    grid.write_bytes(b"".join(orjson.dumps(grid_event(e, "Scheduled", [f"vm-{n:03d}"])) + b"\n"
                              for n, e in enumerate(ids)))  # fmt: skip
    sink = tmp_path / "down" / "azure.jsonl"
    state = tmp_path / "state"
    service = AzureChannel(
        [create_source(f"file://{grid}", state, "g")], [create_sink(f"file://{sink}")], state
    )
    service.outbox.max_records = 100
    runner = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    try:
        wait_until(lambda: service.outbox.pending[0] == 100, 30, what="the outbox full")
        sink.parent.mkdir()  # the sink is back
        wait_until(
            lambda: sink.exists() and len(sink.read_bytes().splitlines()) >= 300, 60, what="300 records"
        )
        wait_until(lambda: service.outbox.pending[0] == 0, 30, what="the outbox drained")
        records = [orjson.loads(line) for line in sink.read_bytes().splitlines()]
        assert sorted(r["event"]["eventId"] for r in records) == sorted(ids)  # each once
    finally:
        service.stop_event.set()
        runner.join(30)
