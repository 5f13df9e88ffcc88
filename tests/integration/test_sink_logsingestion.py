"""The Azure Monitor Logs Ingestion sink (issue 26): the real ``azure-monitor-ingestion`` and
``azure-identity`` clients against a local endpoint that behaves as documented
(tests/peers/logs_ingestion.py: audience, DCR, streams, gzip, 1 MB, 429 with Retry-After).

* The agent as a real process, configured with the sink spec: its records of an emulated event arrive
  as rows, one per record, deduplicable on RecordId, with the record whole.
* 5 000 records through the delivery worker (the outbox and worker of every sink) with a 429 storm in
  the middle: every record arrives at least once, 0 lost; a record longer than Azure's 64 KB field
  limit arrives in parts that join back to it; approval records go to their own stream; a DCR that
  does not exist is permanent (dead letter), a refused token is not (retried: a role takes minutes).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from peers.logs_ingestion import LogsIngestion
from procs import Agent, Emulator, wait_until

from bridge.pipeline import DeliveryWorker, Outbox, PipelineMetrics, RecordMeta, SinkError
from bridge.sinks import create_sink
from bridge.sinks.logsingestion import MAX_FIELD_BYTES, LogsIngestionSink

RULE = "dcr-0123456789abcdef0123456789abcdef"
STREAMS = ("Custom-SeBridgeRecords", "Custom-SeBridgeApprovals", "Custom-SeBridgeFindings")


@pytest.fixture
def endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LogsIngestion]:
    fake = LogsIngestion(tmp_path, RULE, STREAMS)
    for name, value in fake.env().items():
        monkeypatch.setenv(name, value)
    yield fake
    fake.stop()


def spec(fake: LogsIngestion, rule: str = RULE, **options: str) -> str:
    query = "&".join(
        f"{k}={v}" for k, v in {"credential": "managed", "ca_file": fake.ca_file, **options}.items()
    )
    return f"azuremonitor://{fake.host}/{rule}?{query}"


def record(n: int, record_type: str = "scheduledEvents", **extra: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, "recordType": record_type, "recordId": f"00000000-0000-4000-8000-{n:012d}",
            "observedAt": "2026-11-25T10:00:00.000Z", "vm": {"name": "vm-a", "vmId": "v"},
            "events": [{"eventId": f"E-{n}"}], **extra}  # fmt: skip


def test_spec_mistakes_are_refused_and_no_secret_can_be_given() -> None:
    for bad, why in [
        ("azuremonitor://h.ingest.monitor.azure.com/notadcr", "immutable id"),
        ("azuremonitor://h.ingest.monitor.azure.com/dcr-1?credential=sas", "credential"),
        ("azuremonitor://h.ingest.monitor.azure.com/dcr-1?key=abc", "unknown option"),
        ("azuremonitor://h.ingest.monitor.azure.com/dcr-1?stream=Records", "Custom-"),
        ("azuremonitor://h.ingest.monitor.azure.com/dcr-1?audience=http://x", "https"),
        ("azuremonitor://h.ingest.monitor.azure.com/dcr-1?client_id=me", "UUID"),
    ]:
        with pytest.raises(SinkError, match=why):
            create_sink(bad)


def test_the_agents_records_arrive_as_rows(endpoint: LogsIngestion, tmp_path: Path) -> None:
    emulator = Emulator()
    env = {**os.environ, **endpoint.env()}
    agent = Agent(emulator.url, tmp_path, sink=spec(endpoint), env=env).start(first_record=False)
    try:
        wait_until(lambda: endpoint.all_rows(), 30, what="the first record's row")
        event_id = emulator.add_event(eventType="Freeze", durationInSeconds=5)
        wait_until(
            lambda: any(event_id in r["EventIds"] for r in endpoint.all_rows()), 30, what="the event's row"
        )
    finally:
        agent.stop()
        emulator.stop()
    rows = endpoint.rows["Custom-SeBridgeRecords"]
    assert all(r["RecordType"] == "scheduledEvents" and r["PartCount"] == 1 for r in rows)
    row = next(r for r in rows if event_id in r["EventIds"])
    assert row["Record"]["recordId"] == row["RecordId"] and row["VmName"] == row["Record"]["vm"]["name"]
    assert row["TimeGenerated"] == row["Record"]["observedAt"]
    assert all(r["auth"] == "Bearer token-for:https://monitor.azure.com" for r in endpoint.requests)


def drain(
    sink_spec: str, tmp_path: Path, records: list[dict[str, Any]], until: Any, timeout: float = 120
) -> Any:
    outbox = Outbox(tmp_path / "outbox", ["logs"], max_records=20_000, max_bytes=512 * 1024 * 1024)
    for r in records:
        outbox.append(RecordMeta.of(r), orjson.dumps(r), sync=False)
    outbox.sync()
    sink = create_sink(sink_spec)
    sink.id = "logs"
    worker = DeliveryWorker(sink, outbox, PipelineMetrics(), tmp_path / "dead-letter")
    worker.open_at_start()
    worker.start()
    try:
        wait_until(until, timeout, what="delivered")
    finally:
        worker.stop(5)
        worker.join(10)
        outbox.close()
    return worker


def test_5000_records_through_a_429_storm_arrive_at_least_once(
    endpoint: LogsIngestion, tmp_path: Path
) -> None:
    records = [record(n) for n in range(5000)]
    records[100] = record(100, "approval", eventIds=["E-100"])
    records[200] = record(200, raw={"Events": ["x" * 1000] * 150})  # about 150 KB: parts
    endpoint.faults = [(429, {"Retry-After": "1"})] * 6 + [(500, {})] * 2  # the storm, right away

    def ids() -> set[str]:
        return {r["RecordId"] for r in endpoint.all_rows()}

    drain(spec(endpoint, batch="500"), tmp_path, records, lambda: len(ids()) == 5000)
    assert ids() == {r["recordId"] for r in records}  # 0 lost (at least once: a retry may repeat rows)
    assert [r["RecordId"] for r in endpoint.rows["Custom-SeBridgeApprovals"]][:1] == [
        records[100]["recordId"]
    ]
    mine = records[200]["recordId"]
    parts = sorted(
        (r for r in endpoint.rows["Custom-SeBridgeRecords"] if r["RecordId"] == mine),
        key=lambda r: r["PartIndex"],
    )
    assert len(parts) == parts[0]["PartCount"] >= 3 and all(
        len(p["RecordText"]) <= MAX_FIELD_BYTES for p in parts
    )
    assert orjson.loads("".join(p["RecordText"] for p in parts)) == records[200]
    assert endpoint.faults == []  # the storm was answered (and its chunks retried)


def test_a_missing_rule_is_dead_lettered_and_a_refused_token_is_retried(
    endpoint: LogsIngestion, tmp_path: Path
) -> None:
    dead_dir = tmp_path / "a" / "dead-letter"
    missing = spec(endpoint, rule="dcr-ffffffffffffffffffffffffffffffff")
    worker = drain(
        missing, tmp_path / "a", [record(1)], lambda: dead_dir.exists() and any(dead_dir.iterdir())
    )
    assert worker is not None
    dead = next(dead_dir.iterdir()).read_text()
    assert "404" in dead and "token-for" not in dead
    wrong = spec(endpoint, audience="https://monitor.azure.us")
    sink = create_sink(wrong)
    assert isinstance(sink, LogsIngestionSink)
    sink.open()
    sink.submit(type("E", (), {"seq": 1, "payload": orjson.dumps(record(1))})())  # type: ignore[arg-type]
    (outcome,) = sink.poll(1)
    assert outcome.error is not None and outcome.error.retryable and outcome.error.kind == "auth"
    sink.close()


def test_the_installers_config_carries_the_sink_and_the_agent_loads_it(tmp_path: Path) -> None:
    """The deploy path (bridge.commands.install_config, what the extension and the VM Application run)
    renders the agent's TOML with the Azure Monitor sink beside the records hub; the agent's own loader
    accepts it and each sink is built from it."""
    import argparse

    from bridge.agent.config import load_agent_config
    from bridge.commands.install_config import apply_agent_inputs, render_toml, validate

    monitor = "azuremonitor://se-dcr-ab12.westeurope-1.ingest.monitor.azure.com/dcr-0123456789abcdef0123456789abcdef"
    monitor += "?credential=managed&client_id=0f8fad5b-d9cb-469f-a165-70867728950e"
    hub = "eventhubs://ns.servicebus.windows.net/se-records?credential=managed"
    agent: dict[str, Any] = {"sinks": [hub, monitor]}
    apply_agent_inputs(
        agent, {"SEB_LOGS": str(tmp_path), "SEB_SINKS": "", "SEB_STATE": str(tmp_path / "state")}
    )
    path = tmp_path / "config.toml"
    path.write_text(render_toml(agent, {}))
    validate(path)
    config = load_agent_config(argparse.Namespace(config=str(path)), environ={})
    assert list(config.sink) == [hub, monitor]
    assert isinstance(create_sink(config.sink[1]), LogsIngestionSink)


def test_a_413_halves_the_batch_and_loses_nothing(endpoint: LogsIngestion, tmp_path: Path) -> None:
    """Over the 1 MB per call limit: the batch is halved and sent again, every record arrives; only a
    single row refused would be dead-lettered."""
    records = [record(n) for n in range(64)]
    endpoint.faults = [(413, {})]
    drain(
        spec(endpoint, batch="64"),
        tmp_path,
        records,
        lambda: len({r["RecordId"] for r in endpoint.all_rows()}) == 64,
    )
    assert endpoint.faults == []  # the 413 was answered, then the halves went through
    dead = tmp_path / "dead-letter"
    assert not dead.exists() or not any(dead.iterdir())


def test_a_payload_that_is_no_record_is_dead_lettered_and_the_rest_delivered(
    endpoint: LogsIngestion, tmp_path: Path
) -> None:
    """A poison message in the outbox (not JSON, or JSON without a recordId) is refused for good and
    dead-lettered; it neither wedges the queue nor stops the records around it."""
    from bridge.pipeline import RecordMeta

    outbox = Outbox(tmp_path / "outbox", ["logs"])
    good = [record(1), record(2)]
    outbox.append(RecordMeta.of(good[0]), orjson.dumps(good[0]))
    outbox.append(RecordMeta("poison-1", "scheduledEvents", "vm"), b"\xff not json")
    outbox.append(RecordMeta("poison-2", "scheduledEvents", "vm"), b'{"recordType": "scheduledEvents"}')
    outbox.append(RecordMeta.of(good[1]), orjson.dumps(good[1]))
    outbox.close()
    dead = tmp_path / "dead-letter"
    drain(
        spec(endpoint),
        tmp_path,
        [],
        lambda: len(endpoint.all_rows()) == 2 and dead.exists() and any(dead.iterdir()),
    )
    assert {r["RecordId"] for r in endpoint.all_rows()} == {g["recordId"] for g in good}
    letters = [orjson.loads(line) for p in dead.iterdir() for line in p.read_bytes().splitlines()]
    assert [(d["recordId"], d["kind"]) for d in letters] == [("poison-1", "invalid"), ("poison-2", "invalid")]
    assert "not json" in letters[0]["recordText"] and letters[1]["record"] == {
        "recordType": "scheduledEvents"
    }
