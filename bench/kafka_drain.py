"""Kafka backlog drain: how fast a long broker outage's backlog leaves the outbox once Kafka is back.

Why this exists: while a broker is down the outbox keeps every record (up to 10 000 by default); when
it comes back, that backlog should be gone in seconds, so the consumers see the present again soon.
The target is at least 2000 records/s on a small VM (2 cores). Run by hand, it is not a test:

    .venv/bin/python bench/kafka_drain.py                     # 10 000 records, local Tansu broker
    .venv/bin/python bench/kafka_drain.py --records 2000 --bootstrap host:9092   # another broker

What is measured, end to end through the real code: an outbox holding ``--records`` records (about
the size of a real record with one event, written and fsynced by :class:`bridge.pipeline.Outbox`
before the clock starts), then the agent's own :class:`bridge.pipeline.DeliveryWorker` driving a
:class:`bridge.sinks.kafka.KafkaSink` (idempotent, ``acks=all``, 1000 records in flight) until the
sink's cursor has passed every record, i.e. until every record was acknowledged by the broker and the
acknowledgement saved. The topic is then read back to check that every record arrived, in order.
The broker is a local Tansu process (in memory) unless ``--bootstrap`` names another one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the Tansu fixture (tests/brokers.py) and its helpers

from benchkit import sample_record  # noqa: E402
from brokers import TansuBroker, TopicReader  # noqa: E402

from bridge.agent.metrics import AgentMetrics  # noqa: E402
from bridge.pipeline import DeliveryWorker, Outbox, RecordMeta  # noqa: E402
from bridge.sinks.kafka import KafkaSink  # noqa: E402

TARGET = 2000.0  # records/s


def run(records: int, bootstrap: str, topic: str, workdir: Path, verify: bool) -> dict[str, float]:
    spec = f"kafka://{bootstrap}/{topic}?client_id=se-bridge-bench"
    sink = KafkaSink(spec)
    outbox = Outbox(workdir / "outbox", [sink.id], max_records=records + 1, max_bytes=1 << 30)
    vm_id = str(uuid.uuid4())
    ids = []
    started = time.perf_counter()
    for n in range(records):
        record = sample_record(n, vm_id)
        record_id, payload = record["recordId"], orjson.dumps(record)
        outbox.append(RecordMeta.of(record), payload)
        ids.append(record_id)
    fill = time.perf_counter() - started
    print(f"outbox filled: {records} records in {fill:.1f} s (fsync each)", flush=True)

    worker = DeliveryWorker(sink, outbox, AgentMetrics(), workdir / "dead-letter")
    worker.open_at_start()  # connect and fetch the topic's metadata before the clock starts
    started = time.perf_counter()
    worker.start()
    while outbox.depth(sink.id) > 0:
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    worker.stop(5.0)
    worker.join(10)
    outbox.close()
    rate = records / elapsed
    result = {"records": float(records), "seconds": elapsed, "recordsPerSecond": rate}
    if verify:
        reader = TopicReader(bootstrap, topic)
        try:
            got = reader.wait_for(lambda m: len(m) >= records, 120, what="every record read back")
        finally:
            reader.close()
        seen: set[str] = set()
        first = []
        for message in got:
            rid = orjson.loads(message.value())["recordId"]
            if rid not in seen:
                seen.add(rid)
                first.append(rid)
        assert first == ids, "records missing or out of order on the topic"
        result["duplicates"] = float(len(got) - len(first))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000, help="backlog size (default 10000)")
    parser.add_argument("--bootstrap", help="host:port of a broker to use instead of a local Tansu")
    parser.add_argument("--topic", default=f"se-bench-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--no-verify", action="store_true", help="do not read the topic back")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="se-kafka-drain-") as tmp:
        workdir = Path(tmp)
        if args.bootstrap:
            result = run(args.records, args.bootstrap, args.topic, workdir, not args.no_verify)
        else:
            with TansuBroker(workdir) as broker:
                result = run(args.records, broker.bootstrap, args.topic, workdir, not args.no_verify)
    verdict = "PASS" if result["recordsPerSecond"] >= TARGET else "FAIL"
    print(
        f"drained {int(result['records'])} records in {result['seconds']:.2f} s: "
        f"{result['recordsPerSecond']:.0f} records/s (target >= {TARGET:.0f}: {verdict})"
    )
    if "duplicates" in result:
        print(f"read back: all {int(result['records'])} in order, {int(result['duplicates'])} duplicates")
    print(orjson.dumps(result).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
