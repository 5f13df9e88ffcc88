"""What the benchmarks share: percentiles, the emulator's control API, stopping a child process, a
record shaped like the agent's.

The benchmarks run as ``python bench/<name>.py``, so this module is importable as ``benchkit`` from
the script's own directory. ``http.client`` rather than ``requests`` keeps the benchmarks' own CPU and
GIL hold times small while their threads are timing the agent.
"""

from __future__ import annotations

import contextlib
import http.client
import signal
import subprocess
import uuid
from typing import Any

import orjson


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); with few samples p99 ~ the max."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples: list[float]) -> dict[str, Any]:
    """n, p50, p99, min, max and the rounded samples (for the JSON results)."""
    return {
        "n": len(samples),
        "p50": percentile(samples, 0.50),
        "p99": percentile(samples, 0.99),
        "min": min(samples) if samples else None,
        "max": max(samples) if samples else None,
        "samples": [round(v, 3) for v in samples],
    }


def emulator_control(host: str, port: int, method: str, path: str, body: Any = None) -> Any:
    """One call to the emulator's control API (``/_emulator/<path>``); ``RuntimeError`` on >= 300."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        payload = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, "/_emulator/" + path, body=payload, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status >= 300:
        raise RuntimeError(f"emulator {method} {path} answered {resp.status}: {data[:300]!r}")
    return orjson.loads(data)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; closes its stdout pipe."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def sample_record(n: int, vm_id: str) -> dict[str, Any]:
    """A record shaped like the agent's (one Freeze event, raw document included), ~1.6 KB."""
    record_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{vm_id}/{n}"))
    event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"event/{n}")).upper()
    event = {
        "EventId": event_id,
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm-bridge-0"],
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 23 Nov 2026 09:51:23 GMT",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": 9,
    }
    record = {
        "schemaVersion": 1,
        "recordType": "scheduledEvents",
        "recordId": record_id,
        "observedAt": "2026-11-22T09:36:23.510Z",
        "source": {"agentVersion": "0.1.0", "apiVersion": "2020-07-01"},
        "vm": {
            "vmId": vm_id,
            "name": "vm-bridge-0",
            "resourceId": "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg"
            "/providers/Microsoft.Compute/virtualMachines/vm-bridge-0",
            "location": "westeurope",
        },
        "documentIncarnation": n + 1,
        "previousIncarnation": n,
        "events": [
            {
                "eventId": event_id,
                "eventType": "Freeze",
                "eventStatus": "Scheduled",
                "resourceType": "VirtualMachine",
                "resources": ["vm-bridge-0"],
                "notBefore": "2026-11-23T09:51:23Z",
                "description": "Host server is undergoing maintenance.",
                "eventSource": "Platform",
                "durationInSeconds": 9,
                "affectsThisVm": True,
            }
        ],
        "changes": [
            {
                "eventId": event_id,
                "change": "scheduled",
                "eventType": "Freeze",
                "previousStatus": None,
                "eventStatus": "Scheduled",
            }
        ],
        "raw": {"DocumentIncarnation": n + 1, "Events": [event]},
    }
    return record


# -- records as an agent writes them (every field its schema requires: services read records through
# -- bridge.records.reader, which refuses anything else) --------------------------------------------

VM_FIELDS = ("vmId", "name", "resourceId", "subscriptionId", "resourceGroup", "location", "zone",
             "vmScaleSetName", "privateIp", "hostname")  # fmt: skip
EVENT_DEFAULTS: dict[str, Any] = {
    "eventType": "Freeze", "eventStatus": "Scheduled", "resourceType": "VirtualMachine", "resources": [],
    "notBefore": None, "description": None, "eventSource": "Platform", "durationInSeconds": None,
    "affectsThisVm": True,
}  # fmt: skip


def vm_block(**given: Any) -> dict[str, Any]:
    """A record's ``vm`` block: ``given`` fields (record names), the others null."""
    return {k: given.get(k) for k in VM_FIELDS}


def event_block(**given: Any) -> dict[str, Any]:
    """A record's event: ``given`` fields, the others as an agent writes them; an empty NotBefore
    (IMDS's, once Started) is null in a record."""
    event = {**EVENT_DEFAULTS, **given}
    event["notBefore"] = event["notBefore"] or None
    return event


def scheduled_events_bytes(
    vm: dict[str, Any],
    events: list[dict[str, Any]],
    observed_at: str,
    changes: list[dict[str, Any]] | None = None,
) -> bytes:
    """One scheduledEvents record, valid against schemas/record.v1.schema.json."""
    return orjson.dumps({
        "schemaVersion": 1, "recordType": "scheduledEvents", "recordId": str(uuid.uuid4()),
        "observedAt": observed_at, "source": {"agentVersion": "bench", "apiVersion": "2020-07-01"},
        "vm": vm_block(**vm), "documentIncarnation": 1, "previousIncarnation": None,
        "events": [event_block(**e) for e in events], "changes": changes or [], "raw": {},
    })  # fmt: skip


def fleet_topics(bootstrap: str, linger_ms: int) -> Any:
    """The fleet benches' topics on a local broker (``events`` 8 partitions, ``decisions`` 4) and a
    producer that can queue a whole wave of records."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic("events", 8), NewTopic("decisions", 4)]).values():
        future.result(30)
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms,
                     "queue.buffering.max.messages": 1_000_000})  # fmt: skip


def produce_keyed(producer: Any, topic: str, values: list[tuple[str, bytes]]) -> None:
    """Every (key, value) to ``topic``, waiting when the producer's queue is full; flushed."""
    for key, value in values:
        while True:
            try:
                producer.produce(topic, value, key=key.encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(120)
